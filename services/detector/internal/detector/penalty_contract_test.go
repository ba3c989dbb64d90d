package detector

import (
	"context"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// memPenalties is the in-memory double of Penalties, for tests whose subject
// is the detector's logic rather than Redis. It merges as the Redis script
// does, and a penalty is gone at its expiry; penaltiesContract holds both to
// the same behaviour.
type memPenalties struct {
	mu  sync.Mutex
	now func() time.Time
	m   map[string]memPenalty
}

type memPenalty struct {
	multiplier float64
	level      int64
	until      time.Time
}

var _ Penalties = (*memPenalties)(nil)

func newMemPenalties(now func() time.Time) *memPenalties {
	return &memPenalties{now: now, m: map[string]memPenalty{}}
}

func (s *memPenalties) Apply(_ context.Context, principal events.Principal, _ string, p events.Penalty) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	now := s.now()
	until := time.UnixMilli(p.ExpiresAt.UnixMilli()).UTC() // Redis keeps milliseconds
	if !until.After(now) {
		return PenaltyStale, nil
	}
	next := memPenalty{multiplier: p.Multiplier, level: p.Level, until: until}
	if cur, ok := s.m[principal.Key()]; ok && cur.until.After(now) {
		if cur.multiplier <= next.multiplier && cur.level >= next.level && !cur.until.Before(next.until) {
			return PenaltyUnchanged, nil
		}
		next.multiplier, next.level = min(cur.multiplier, next.multiplier), max(cur.level, next.level)
		if cur.until.After(next.until) {
			next.until = cur.until
		}
	}
	s.m[principal.Key()] = next
	return PenaltyApplied, nil
}

func (s *memPenalties) Get(_ context.Context, principal events.Principal) (float64, time.Time, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	cur, ok := s.m[principal.Key()]
	if !ok || !cur.until.After(s.now()) {
		return 1, time.Time{}, nil
	}
	return cur.multiplier, cur.until, nil
}

// TestPenaltiesContract runs the contract of Penalties against the Redis
// store and the in-memory double.
func TestPenaltiesContract(t *testing.T) {
	t.Run("redis", func(t *testing.T) {
		rdb := redistest.Client(t)
		penaltiesContract(t, func() Penalties { return NewPenaltyStore(rdb) })
	})
	t.Run("memory", func(t *testing.T) {
		penaltiesContract(t, func() Penalties { return newMemPenalties(time.Now) })
	})
}

// penaltiesContract is what every Penalties does. open returns a store; the
// principals of each case are unique, so stores may be shared.
func penaltiesContract(t *testing.T, open func() Penalties) {
	ctx := context.Background()
	exp := time.Now().Add(time.Minute).Truncate(time.Millisecond).UTC()
	type apply struct {
		m     float64
		level int64
		until time.Time
		want  int // PenaltyApplied, PenaltyUnchanged or PenaltyStale
	}
	tests := []struct {
		name      string
		applies   []apply
		wantM     float64
		wantUntil time.Time
	}{
		{"none until applied", nil, 1, time.Time{}},
		{"applied", []apply{{0.1, 1, exp, PenaltyApplied}}, 0.1, exp},
		{"a redelivered penalty changes nothing", []apply{{0.1, 1, exp, PenaltyApplied}, {0.1, 1, exp, PenaltyUnchanged}}, 0.1, exp},
		{"a weaker, shorter penalty does not loosen a stronger one",
			[]apply{{0.1, 2, exp, PenaltyApplied}, {0.5, 1, exp.Add(-30 * time.Second), PenaltyUnchanged}}, 0.1, exp},
		{"a longer penalty extends the expiry and keeps the strongest multiplier",
			[]apply{{0.1, 1, exp, PenaltyApplied}, {0.5, 2, exp.Add(time.Minute), PenaltyApplied}}, 0.1, exp.Add(time.Minute)},
		{"a stronger multiplier replaces a weaker one",
			[]apply{{0.5, 1, exp, PenaltyApplied}, {0.05, 1, exp.Add(-time.Second), PenaltyApplied}}, 0.05, exp},
		{"a higher level alone is applied", []apply{{0.1, 1, exp, PenaltyApplied}, {0.1, 2, exp, PenaltyApplied}}, 0.1, exp},
		{"a penalty already over when written is stale", []apply{{0.1, 1, time.Now().Add(-time.Hour), PenaltyStale}}, 1, time.Time{}},
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
		require.Equal(t, PenaltyApplied, n)
		require.Eventually(t, func() bool {
			m, _, err := s.Get(ctx, p)
			return err == nil && m == 1
		}, 3*time.Second, 20*time.Millisecond)
		n, err = s.Apply(ctx, p, "ab_2", events.Penalty{Multiplier: 0.5, ExpiresAt: exp, Level: 1})
		require.NoError(t, err)
		require.Equal(t, PenaltyApplied, n, "an expired penalty does not hold back a new one")
	})
}

// TestPenaltyStoreKeyExpires: the Redis store's key lives as long as the
// penalty, so the limiter's Lua reads nothing once it is over.
func TestPenaltyStoreKeyExpires(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	p := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "pen")}
	_, err := NewPenaltyStore(rdb).Apply(ctx, p, "ab_1", events.Penalty{Multiplier: 0.1, ExpiresAt: time.Now().Add(2 * time.Minute), Level: 1})
	require.NoError(t, err)
	ttl, err := rdb.PTTL(ctx, redisx.PenaltyKey(string(p.Kind), p.ID)).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Minute)
	require.LessOrEqual(t, ttl, 2*time.Minute)
}
