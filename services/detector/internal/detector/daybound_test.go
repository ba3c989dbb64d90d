package detector

import (
	"context"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

func TestDayBound(t *testing.T) {
	bounds, err := events.ParseDayBounds("bot=100,api_key=50", 10)
	require.NoError(t, err)
	b := NewDayBound(bounds, prometheus.NewRegistry())
	day1 := time.Date(2026, 11, 29, 23, 0, 0, 0, time.UTC)
	ev := func(kind events.PrincipalKind, id string, at time.Time, cost int64, allowed bool) *events.Decision {
		return &events.Decision{Principal: events.Principal{Kind: kind, ID: id}, TS: at, Cost: cost, Allowed: allowed}
	}
	require.NoError(t, b.Admit(ev(events.PrincipalBot, "a", day1, 100, true), 10_000))
	require.NoError(t, b.Admit(ev(events.PrincipalBot, "a", day1, 10, true), 10_000), "110: at the bound")
	var dbe *events.DayBoundError
	require.ErrorAs(t, b.Admit(ev(events.PrincipalBot, "a", day1, 1, true), 10_000), &dbe)
	require.Equal(t, events.DayBoundError{Principal: "bot:a", Day: "2026-11-29", Charged: 110, Cost: 1, Bound: 110}, *dbe)
	require.True(t, stream.IsPermanent(dbe))
	require.NoError(t, b.Admit(ev(events.PrincipalBot, "a", day1, 1_000, false), 10_000), "denied decisions charge nothing")
	require.NoError(t, b.Admit(ev(events.PrincipalBot, "b", day1, 110, true), 10_000), "per principal")
	require.NoError(t, b.Admit(ev(events.PrincipalUser, "a", day1, 5_000, true), 10_000), "a kind without a quota is unbounded")
	require.Error(t, b.Admit(ev(events.PrincipalAPIKey, "k", day1, 56, true), 10_000))
	require.Error(t, b.Admit(ev(events.PrincipalBot, "c", day1, 10_001, true), 10_000), "the cost cap first")

	day2 := day1.Add(2 * time.Hour)
	require.NoError(t, b.Admit(ev(events.PrincipalBot, "a", day2, 110, true), 10_000), "a new day")
	require.Error(t, b.Admit(ev(events.PrincipalBot, "a", day1, 1, true), 10_000), "yesterday is still counted")
	require.Len(t, b.days, 2)
	require.NoError(t, b.Admit(ev(events.PrincipalBot, "a", day2.Add(48*time.Hour), 1, true), 10_000))
	require.Len(t, b.days, 1, "days before yesterday are dropped")
	require.Equal(t, 3.0, testutil.ToFloat64(b.refused))

	var none *DayBound
	require.NoError(t, none.Admit(ev(events.PrincipalBot, "a", day1, 10_000, true), 10_000), "nil: the cost cap only")
	require.Error(t, none.Admit(ev(events.PrincipalBot, "a", day1, 10_001, true), 10_000))
}

// TestSecurityDayBoundT1 replays row 1 of issue 37 at the detector: a
// producer that may write to the decisions topic sends events at the cost
// cap (10,000, each accepted alone) naming one bot, past the bot's 86,400
// daily quota. Now the events that would charge it past its day's bound
// (86,400 + 10 %) are dead-lettered with the reason, counted, and never
// scored.
func TestSecurityDayBoundT1(t *testing.T) {
	d := newTestDetector(t, &flakyPublisher{}, nil)
	bounds, err := events.ParseDayBounds(events.DefaultDayQuotas, events.DefaultDaySlackPercent)
	require.NoError(t, err)
	db := NewDayBound(bounds, prometheus.NewRegistry())
	d.SetDayBound(db)
	ctx := context.Background()
	victim := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "t1")}
	now := time.Now().UTC()
	var refused int
	for i := range 12 {
		ev := decision(victim, now, "198.51.100.10", "/a")
		ev.Cost, ev.Allowed = events.DefaultMaxCost, true
		v, err := events.EncodeDecision(ev)
		require.NoError(t, err)
		err = d.Handle(ctx, kafka.Message{Topic: "floodgate.decisions.v1", Partition: 3, Offset: int64(i), Value: v})
		if i < 9 { // 90,000 ≤ 95,040
			require.NoError(t, err)
			continue
		}
		require.True(t, stream.IsPermanent(err), "dead-lettered, not retried: %v", err)
		require.ErrorContains(t, err, "over the 95040 a principal of its kind may be charged in a day")
		refused++
	}
	require.Equal(t, 3, refused)
	require.Equal(t, 3.0, testutil.ToFloat64(db.refused))
	require.Equal(t, 9.0, testutil.ToFloat64(d.metrics.decoded), "the nine within the bound are scored, the three past it are not")
}
