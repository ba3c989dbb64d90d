package detector

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

func TestLadderStepsMoveGeometricallyToThePolicy(t *testing.T) {
	l := DefaultLadder()
	policy := PatternPolicy{Multiplier: 0.1, TTL: 30 * time.Minute}
	cases := []struct {
		step int
		m    float64
		ttl  time.Duration
	}{
		{1, 0.4642, 2 * time.Minute},
		{2, 0.2154, 7*time.Minute + 45*time.Second},
		{3, 0.1, 30 * time.Minute},
		{4, 0.1, 30 * time.Minute},
	}
	for _, tc := range cases {
		t.Run(fmt.Sprint("step ", tc.step), func(t *testing.T) {
			m, ttl := l.penalty(policy, tc.step)
			require.InDelta(t, tc.m, m, 1e-4)
			require.Equal(t, tc.ttl, ttl)
		})
	}
	m, ttl := Ladder{Steps: 1}.penalty(policy, 1)
	require.Equal(t, policy.Multiplier, m, "one step: the full policy at once")
	require.Equal(t, policy.TTL, ttl)
}

func TestFirstStepIsProportionalToTheEvidence(t *testing.T) {
	l := DefaultLadder()
	rate := func(sc float64, sustained time.Duration) *score.Detection {
		return &score.Detection{Pattern: score.RapidFire, Score: sc, Threshold: 5, ObservedRate: sc * 2, ExpectedRate: 2,
			Sustained: sustained, Window: 10 * time.Second, BaselineSource: score.SourceFloor}
	}
	limit := func(ratio float64, denials int64) *score.Detection {
		return &score.Detection{Pattern: score.RapidFire, Score: 1 / (1 - ratio), Threshold: 1.5, DenialRatio: ratio, Denials: denials,
			BaselineSource: score.SourceLimit, Window: 10 * time.Second}
	}
	cases := []struct {
		name string
		det  *score.Detection
		want int
	}{
		{"just past the line, past a burst", rate(6, 7500*time.Millisecond), 1},
		{"twice the line", rate(11, 7500*time.Millisecond), 2},
		{"just past the line for the whole window", rate(6, 10*time.Second), 2},
		{"four times the line", rate(25, 7500*time.Millisecond), 3},
		{"a third refused", limit(0.4, 25), 1},
		{"three in four refused", limit(0.8, 60), 2},
		{"nearly all refused, many", limit(0.95, 400), 3},
		{"nearly all refused, few", limit(0.95, 40), 2},
		{"distributed_ip at its line", &score.Detection{Pattern: score.DistributedIP, Score: 1, Threshold: 1, UnsharedIPs: 20, NetworkThreshold: 20}, 1},
		{"distributed_ip at 5× its line", &score.Detection{Pattern: score.DistributedIP, Score: 5, Threshold: 1, UnsharedIPs: 100, NetworkThreshold: 20}, 3},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			step, why := l.firstStep(tc.det)
			require.Equal(t, tc.want, step, why)
			require.Contains(t, why, fmt.Sprintf("step %d of 3", tc.want))
			require.LessOrEqual(t, len([]rune(why)), events.MaxStepReasonLen)
		})
	}
}

// TestPenaltyEscalatesOnlyOnPersistence: a person holding 1.3× the line past
// a burst gets step 1 (×0.46 for 2 minutes) and a reason; detected again
// within its incident (it kept going past the cool-down) it goes to step 2,
// then 3, never past it. The abuse event and the penalty in the store carry
// the step.
func TestPenaltyEscalatesOnlyOnPersistence(t *testing.T) {
	pub := &flakyPublisher{}
	d := newTestDetector(t, pub, func(c *Config) {
		c.Ladder = DefaultLadder()
		c.Score.Window, c.Score.PersonSustain = 10*time.Second, 5*time.Second
		c.Policies[score.RapidFire] = PatternPolicy{Multiplier: 0.1, TTL: 30 * time.Minute, Enforce: true}
		c.Escalation.Jitter = 0
	})
	ctx := context.Background()
	p := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "ladder")}
	start := time.Now().UTC().Add(-4 * time.Minute).Truncate(time.Second)
	// 13 calls/s over 8 routes (1.6/s a route, inside every limit): 1.3×
	// the line of 10/s, held for four minutes.
	off := int64(0)
	for i := range 13 * 240 {
		at := start.Add(time.Duration(i) * time.Second / 13)
		ev := &events.Decision{ID: fmt.Sprintf("d%d", i), TS: at, Principal: p, IP: netip.MustParseAddr("198.51.100.30"), Method: "GET",
			Route: fmt.Sprintf("/r%d", i%8), Allowed: true, Tier: events.TierPrincipal, Cost: 1, Limit: 10, Remaining: 8, Gateway: "t"}
		require.NoError(t, d.Handle(ctx, kafka.Message{Topic: "floodgate.decisions.v1", Partition: 0, Offset: off, Value: encodeDecision(t, ev)}))
		off++
	}
	var steps []int64
	for _, m := range pub.msgs {
		a, err := events.DecodeAbuse(m.Value)
		require.NoError(t, err)
		require.Equal(t, score.RapidFire, a.Pattern)
		require.NotEmpty(t, a.Penalty.Reason)
		steps = append(steps, a.Penalty.Step)
		if a.Penalty.Step == 1 {
			require.InDelta(t, 0.464, a.Penalty.Multiplier, 1e-3)
			require.Equal(t, 2*time.Minute, a.Penalty.ExpiresAt.Sub(a.DetectedAt))
			require.Contains(t, a.Penalty.Reason, "borderline")
		} else {
			require.Contains(t, a.Penalty.Reason, "persisted")
		}
	}
	require.GreaterOrEqual(t, len(steps), 3, "re-detected after each cool-down: %v", steps)
	require.Equal(t, []int64{1, 2, 3}, steps[:3])
	for _, s := range steps[3:] {
		require.Equal(t, int64(3), s, "never past the last step")
	}
	m, _, err := d.cfg.Penalties.Get(ctx, p)
	require.NoError(t, err)
	require.Equal(t, 0.1, m, "the store holds the strongest step")
}
