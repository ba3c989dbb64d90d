package detector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// decision is one of a test bot's requests: the bots here send 100–200/s
// against a limit of 50, so the limiter denies them, and a bot hammering past
// its limit is what rapid_fire detects in automation.
func decision(p events.Principal, at time.Time, ip, route string) *events.Decision {
	return &events.Decision{ID: "d", TS: at, Principal: p, IP: netip.MustParseAddr(ip), Method: "POST", Route: route, Allowed: false,
		Tier: events.TierPrincipal, Cost: 1, Limit: 50, Remaining: 0, Gateway: "t"}
}

type flakyPublisher struct {
	mu    sync.Mutex
	fails int
	msgs  []kafka.Message
}

func (f *flakyPublisher) Publish(_ context.Context, msgs ...kafka.Message) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.fails > 0 {
		f.fails--
		return errors.New("broker unavailable")
	}
	f.msgs = append(f.msgs, msgs...)
	return nil
}

func newTestDetector(t *testing.T, pub Publisher, mod func(*Config)) *Detector {
	sc := score.DefaultConfig()
	sc.Window = 5 * time.Second
	c := Config{
		Score:      sc,
		Policies:   map[events.Pattern]PatternPolicy{score.RapidFire: {Multiplier: 0.1, TTL: time.Hour, Enforce: true}, score.DistributedIP: {Multiplier: 0.05, TTL: 6 * time.Hour, Enforce: true}},
		Escalation: Escalation{Lookback: 24 * time.Hour, Quiet: 10 * time.Minute, Factor: 2, MaxTTL: 72 * time.Hour, Jitter: 0.1},
		// The Redis store is held to the same contract (TestPenaltiesContract).
		Penalties: NewMemPenalties(time.Now), Publisher: pub, AbuseTopic: "abuse",
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry(),
	}
	if mod != nil {
		mod(&c)
	}
	return New(c)
}

func encodeDecision(t *testing.T, d *events.Decision) []byte {
	b, err := events.EncodeDecision(d)
	require.NoError(t, err)
	return b
}

func TestHandleSendsPoisonStraightToDLQ(t *testing.T) {
	t.Parallel()
	d := newTestDetector(t, &flakyPublisher{}, nil)
	err := d.Handle(context.Background(), kafka.Message{Value: []byte(`{"id":"x"}`)})
	require.True(t, stream.IsPermanent(err), "malformed events are poison: %v", err)
	require.ErrorIs(t, err, events.ErrInvalid)
}

func TestHandleRetryReusesTheDetection(t *testing.T) {
	pub := &flakyPublisher{fails: 2}
	d := newTestDetector(t, pub, nil)
	ctx := context.Background()
	bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "retry")}
	now := time.Now().UTC().Truncate(time.Millisecond)

	var failing kafka.Message
	for i := 0; i < 1000; i++ {
		ev := decision(bot, now.Add(time.Duration(i)*10*time.Millisecond), "203.0.113.9", "/a")
		ev.ID = fmt.Sprintf("d%d", i)
		msg := kafka.Message{Partition: 3, Offset: int64(i), Value: encodeDecision(t, ev)}
		if err := d.Handle(ctx, msg); err != nil {
			failing = msg
			break
		}
	}
	require.NotNil(t, failing.Value, "the detection's publish should have failed")
	// The consume loop retries the same message: the second attempt fails too, the
	// third publishes the abuse event that the first scoring produced.
	require.Error(t, d.Handle(ctx, failing))
	require.NoError(t, d.Handle(ctx, failing))
	require.Len(t, pub.msgs, 1)
	a, err := events.DecodeAbuse(pub.msgs[0].Value)
	require.NoError(t, err)
	require.Equal(t, bot, a.Principal)
	require.Equal(t, events.PenaltyEnforced, a.Penalty.Mode)
	require.Equal(t, bot.Key(), string(pub.msgs[0].Key))
	m, _, err := d.cfg.Penalties.Get(ctx, bot)
	require.NoError(t, err)
	require.Equal(t, 0.1, m)
}

func TestEndedIncidents(t *testing.T) {
	t.Parallel()
	at := func(m int) time.Time {
		return time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC).Add(time.Duration(m) * time.Minute)
	}
	o := func(from, until int) offense { return offense{at(from), at(until)} }
	quiet := 10 * time.Minute
	cases := []struct {
		name string
		offs []offense
		now  int
		want int
	}{
		{"none", nil, 0, 0},
		{"one, still penalized", []offense{o(0, 30)}, 20, 0},
		{"one, penalty over but within quiet", []offense{o(0, 30)}, 35, 0},
		{"one, over", []offense{o(0, 30)}, 41, 1},
		{"re-detections of one attack are one incident", []offense{o(0, 30), o(2, 32), o(5, 35), o(38, 68)}, 70, 0},
		{"two incidents a quiet period apart", []offense{o(0, 30), o(50, 110)}, 200, 2},
		{"the second still running", []offense{o(0, 30), o(50, 110)}, 60, 1},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.want, endedIncidents(tc.offs, at(tc.now), quiet))
		})
	}
}

// TestSecurityFutureEventsS4 replays finding S4 of issue 22: decision events
// dated in the year 2160 moved the scorer's clock, and its sweeps wiped every
// principal's state and the shared-IP exemption. Now they are dead-lettered
// with the reason and never scored; the watermark does not move, and a real
// abuser is still caught.
func TestSecurityFutureEventsS4(t *testing.T) {
	pub := &flakyPublisher{}
	d := newTestDetector(t, pub, nil)
	now := time.Now().UTC()
	ctx := context.Background()
	attacker := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "future")}
	for _, ts := range []time.Time{time.Date(2160, 1, 1, 0, 0, 0, 0, time.UTC), now.Add(time.Hour), now.Add(-30 * 24 * time.Hour)} {
		ev := decision(attacker, ts, "198.51.100.10", "/a")
		v, err := events.EncodeDecision(ev)
		require.NoError(t, err)
		err = d.Handle(ctx, kafka.Message{Topic: "floodgate.decisions.v1", Partition: 1, Offset: 1, Value: v})
		require.Error(t, err, "%s", ts)
		require.True(t, stream.IsPermanent(err), "dead-lettered, not retried: %v", err)
	}
	require.False(t, d.scorer(1).Watermark().After(now.Add(time.Minute)), "the scorer's clock did not move")
	bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "stillcaught")}
	for i := 0; i < 2000; i++ {
		ev := decision(bot, now.Add(time.Duration(i)*5*time.Millisecond), "203.0.113.9", "/a")
		v, err := events.EncodeDecision(ev)
		require.NoError(t, err)
		require.NoError(t, d.Handle(ctx, kafka.Message{Topic: "floodgate.decisions.v1", Partition: 1, Offset: int64(10 + i), Value: v}))
	}
	require.NotEmpty(t, pub.msgs, "the bot is caught as usual")
}

// TestSecurityAbuseEventsKeepNetworksS15 replays finding S15 of issue 22:
// abuse events kept full client addresses for the topic's 30 days. Now they
// carry the IPv4 /24 or the IPv6 /48 only.
func TestSecurityAbuseEventsKeepNetworksS15(t *testing.T) {
	for _, tc := range []struct{ ip, want string }{
		{"203.0.113.9", "203.0.113.0"},
		{"2001:db8:aaaa:bbbb:cccc::9", "2001:db8:aaaa::"},
	} {
		pub := &flakyPublisher{}
		d := newTestDetector(t, pub, nil)
		bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "s15")}
		botBurst(t, d, bot, time.Now().UTC(), tc.ip)
		require.NotEmpty(t, pub.msgs)
		a, err := events.DecodeAbuse(pub.msgs[0].Value)
		require.NoError(t, err)
		require.NotEmpty(t, a.Evidence.TopIPs)
		for _, ip := range a.Evidence.TopIPs {
			require.Equal(t, tc.want, ip.IP.String())
		}
	}
}

// TestSecurityOverCostEventsS3 replays finding S3 of issue 22 at the detector:
// a decision event with cost 1,000,000. It is dead-lettered (permanent, with
// the reason) and never scored; events within FLOODGATE_EVENT_MAX_COST are.
func TestSecurityOverCostEventsS3(t *testing.T) {
	pub := &flakyPublisher{}
	d := newTestDetector(t, pub, nil)
	ctx := context.Background()
	victim := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "s3")}
	ev := decision(victim, time.Now().UTC(), "198.51.100.10", "/a")
	ev.Cost = 1_000_000
	v, err := events.EncodeDecision(ev)
	require.NoError(t, err)
	err = d.Handle(ctx, kafka.Message{Topic: "floodgate.decisions.v1", Partition: 2, Offset: 1, Value: v})
	require.True(t, stream.IsPermanent(err), "dead-lettered, not retried: %v", err)
	require.EqualError(t, err, "cost 1000000 is over the 10000 an event may carry (FLOODGATE_EVENT_MAX_COST); nothing of it was counted")
	require.Zero(t, d.scorer(2).Stats().Principals, "never scored")

	ev.Cost = events.DefaultMaxCost
	v, err = events.EncodeDecision(ev)
	require.NoError(t, err)
	require.NoError(t, d.Handle(ctx, kafka.Message{Topic: "floodgate.decisions.v1", Partition: 2, Offset: 2, Value: v}))
	require.Equal(t, 1, d.scorer(2).Stats().Principals, "at the bound it is scored")
}
