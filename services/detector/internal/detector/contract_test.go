package detector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
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

// page is one alert as its receiver saw it.
type page struct {
	key, summary string
	details      map[string]any
}

// memAlerter is the in-memory double of Alerter: it keeps every page, and
// fails the next down calls as an unreachable PagerDuty would.
type memAlerter struct {
	mu    sync.Mutex
	pages []page
	down  int
}

var _ Alerter = (*memAlerter)(nil)

func (a *memAlerter) Alert(_ context.Context, key, summary string, details map[string]any) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down > 0 {
		a.down--
		return fmt.Errorf("alert %s: %w", key, errors.New("pager unavailable"))
	}
	a.pages = append(a.pages, page{key: key, summary: summary, details: details})
	return nil
}

// alerterUnderTest is an Alerter with a view of what its receiver got and a
// way to make the receiver fail the next n calls.
type alerterUnderTest struct {
	Alerter
	pages func() []page
	down  func(n int)
}

// TestAlerterContract runs the contract of Alerter against the PagerDuty pager
// (Events API v2 to a local receiver) and the in-memory double.
func TestAlerterContract(t *testing.T) {
	t.Parallel()
	t.Run("pagerduty", func(t *testing.T) {
		alerterContract(t, func(t *testing.T) alerterUnderTest {
			recv := stacktest.PagerDutyFor(t)
			p, err := NewPager(PagerConfig{RoutingKey: "rk", Endpoint: recv.URL, MinSeverity: "critical", PerMinute: 1, Now: time.Now,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry()})
			require.NoError(t, err)
			return alerterUnderTest{Alerter: p, pages: func() []page { return pagesOf(recv) }, down: recv.FailNext}
		})
	})
	t.Run("memory", func(t *testing.T) {
		alerterContract(t, func(*testing.T) alerterUnderTest {
			a := &memAlerter{}
			return alerterUnderTest{Alerter: a, pages: func() []page {
				a.mu.Lock()
				defer a.mu.Unlock()
				return append([]page(nil), a.pages...)
			}, down: func(n int) {
				a.mu.Lock()
				a.down = n
				a.mu.Unlock()
			}}
		})
	})
}

// alerterContract is what every Alerter does.
func alerterContract(t *testing.T, open func(t *testing.T) alerterUnderTest) {
	ctx := context.Background()
	t.Run("every alert reaches the receiver with its key, summary and details", func(t *testing.T) {
		a := open(t)
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", map[string]any{"pattern": "rapid_fire"}))
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:distributed_ip", "enforcement held again", map[string]any{"pattern": "distributed_ip"}))
		require.Equal(t, []page{
			{key: "floodgate:blast_radius:rapid_fire", summary: "enforcement held", details: map[string]any{"pattern": "rapid_fire"}},
			{key: "floodgate:blast_radius:distributed_ip", summary: "enforcement held again", details: map[string]any{"pattern": "distributed_ip"}},
		}, a.pages())
	})
	t.Run("an alert the receiver refused is an error, and the next one goes through", func(t *testing.T) {
		a := open(t)
		a.down(1)
		err := a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", nil)
		require.ErrorContains(t, err, "floodgate:blast_radius:rapid_fire")
		require.Empty(t, a.pages())
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", nil))
		require.Len(t, a.pages(), 1)
	})
}

// pagesOf returns the events the receiver accepted, as pages.
func pagesOf(recv *stacktest.PagerDuty) []page {
	var out []page
	for _, e := range recv.All() {
		payload, _ := e["payload"].(map[string]any)
		details, _ := payload["custom_details"].(map[string]any)
		out = append(out, page{key: fmt.Sprint(e["dedup_key"]), summary: fmt.Sprint(payload["summary"]), details: details})
	}
	return out
}
