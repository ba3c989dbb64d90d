// Package penaltytest is the exported contract suite of the detector's
// penalty store port (detector.Penalties), run against the Redis store and
// the in-memory double alike.
package penaltytest

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector"
)

// Run is the contract of detector.Penalties: what every store does (the
// Redis store, detector.MemPenalties). open returns a store; the
// principals of each case are unique, so stores may be shared.
func Run(t *testing.T, open func() detector.Penalties) {
	ctx := context.Background()
	exp := time.Now().Add(time.Minute).Truncate(time.Millisecond).UTC()
	type apply struct {
		m     float64
		level int64
		until time.Time
		want  int // detector.PenaltyApplied, detector.PenaltyUnchanged or detector.PenaltyStale
	}
	tests := []struct {
		name      string
		applies   []apply
		wantM     float64
		wantUntil time.Time
	}{
		{"none until applied", nil, 1, time.Time{}},
		{"applied", []apply{{0.1, 1, exp, detector.PenaltyApplied}}, 0.1, exp},
		{"a redelivered penalty changes nothing", []apply{{0.1, 1, exp, detector.PenaltyApplied}, {0.1, 1, exp, detector.PenaltyUnchanged}}, 0.1, exp},
		{"a weaker, shorter penalty does not loosen a stronger one",
			[]apply{{0.1, 2, exp, detector.PenaltyApplied}, {0.5, 1, exp.Add(-30 * time.Second), detector.PenaltyUnchanged}}, 0.1, exp},
		{"a longer penalty extends the expiry and keeps the strongest multiplier",
			[]apply{{0.1, 1, exp, detector.PenaltyApplied}, {0.5, 2, exp.Add(time.Minute), detector.PenaltyApplied}}, 0.1, exp.Add(time.Minute)},
		{"a stronger multiplier replaces a weaker one",
			[]apply{{0.5, 1, exp, detector.PenaltyApplied}, {0.05, 1, exp.Add(-time.Second), detector.PenaltyApplied}}, 0.05, exp},
		{"a higher level alone is applied", []apply{{0.1, 1, exp, detector.PenaltyApplied}, {0.1, 2, exp, detector.PenaltyApplied}}, 0.1, exp},
		{"a penalty already over when written is stale", []apply{{0.1, 1, time.Now().Add(-time.Hour), detector.PenaltyStale}}, 1, time.Time{}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			s, p := open(), events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "pen")}
			for i, a := range tc.applies {
				n, err := s.Apply(ctx, p, "ab_"+strconv.Itoa(i), events.Penalty{Multiplier: a.m, ExpiresAt: a.until, Level: a.level})
				require.NoError(t, err)
				require.Equal(t, a.want, n, "outcome of apply %d", i)
			}
			m, until, err := s.Get(ctx, p)
			require.NoError(t, err)
			require.Equal(t, tc.wantM, m, "multiplier")
			require.Equal(t, tc.wantUntil, until, "expiry")
		})
	}
	t.Run("a penalty is gone at its expiry", func(t *testing.T) {
		s, p := open(), events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "pen")}
		n, err := s.Apply(ctx, p, "ab_1", events.Penalty{Multiplier: 0.1, ExpiresAt: time.Now().Add(150 * time.Millisecond), Level: 1})
		require.NoError(t, err)
		require.Equal(t, detector.PenaltyApplied, n)
		require.Eventually(t, func() bool {
			m, _, err := s.Get(ctx, p)
			return err == nil && m == 1
		}, 3*time.Second, 20*time.Millisecond)
		n, err = s.Apply(ctx, p, "ab_2", events.Penalty{Multiplier: 0.5, ExpiresAt: exp, Level: 1})
		require.NoError(t, err)
		require.Equal(t, detector.PenaltyApplied, n, "an expired penalty does not hold back a new one")
	})
}
