package admission

import (
	"sync/atomic"
	"testing"
	"time"

	"github.com/failsafe-go/failsafe-go/adaptivelimiter"
	"github.com/stretchr/testify/require"
)

// simLimit drives a ConcurrencyLimit on a simulated clock: each window, the
// load keeps inflight permits busy and every one completes in rtt.
type simLimit struct {
	l   *ConcurrencyLimit
	now time.Duration
}

func newSimLimit(cfg Config) *simLimit {
	s := &simLimit{}
	s.l = NewConcurrencyLimit(cfg, nil)
	s.l.since = func(time.Time) time.Duration { return s.now }
	return s
}

// window runs one window: up to want permits acquired at once (the rest
// refused), each completing after rtt. It returns how many were refused.
func (s *simLimit) window(want int, rtt time.Duration) int {
	refused := 0
	var starts []time.Time
	for range want {
		if !s.l.Acquire() {
			refused++
			continue
		}
		starts = append(starts, s.l.start.Add(s.now))
	}
	s.now += s.l.cfg.Window
	for _, st := range starts {
		st = st.Add(s.l.cfg.Window - rtt) // so that now − start = rtt
		s.l.Release(st)
	}
	return refused
}

// TestConcurrencyLimitAdapts: the limit grows while round trips stay near
// their baseline and the permits are used, holds while the load (not the
// limit) is the bound, and shrinks when queueing makes round trips grow —
// then checks beyond it are refused at once.
func TestConcurrencyLimitAdapts(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.Max = 64, 8, 1024

	t.Run("grows at the baseline when used", func(t *testing.T) {
		s := newSimLimit(cfg)
		for range 50 {
			s.window(int(s.l.Limit()), time.Millisecond)
		}
		require.Greater(t, s.l.Limit(), int64(200), "limit grows while round trips stay at the baseline")
	})
	t.Run("holds when the load is the bound", func(t *testing.T) {
		s := newSimLimit(cfg)
		for range 50 {
			s.window(10, time.Millisecond) // 10 in flight of 64: app-limited
		}
		require.Equal(t, int64(64), s.l.Limit())
	})
	t.Run("shrinks when round trips grow, then refuses", func(t *testing.T) {
		s := newSimLimit(cfg)
		for range 20 {
			s.window(int(s.l.Limit()), time.Millisecond)
		}
		high := s.l.Limit()
		for range 30 { // queueing: 20× the baseline
			s.window(2000, 20*time.Millisecond)
		}
		require.Less(t, s.l.Limit(), high/4, "limit shrinks under queueing")
		require.GreaterOrEqual(t, s.l.Limit(), cfg.Min)
		refused := s.window(2000, 20*time.Millisecond)
		require.Greater(t, refused, 1000, "checks beyond the limit are refused at once")
	})
	t.Run("a slower Redis becomes the new baseline", func(t *testing.T) {
		s := newSimLimit(cfg)
		for range 20 {
			s.window(int(s.l.Limit()), time.Millisecond)
		}
		// +40 ms on every round trip for 10 s: the baseline follows within
		// its buckets (3 × 1 s) and the limit recovers.
		for range 100 {
			s.window(int(s.l.Limit()), 41*time.Millisecond)
		}
		require.Greater(t, s.l.Limit(), int64(200), "the limit recovers once the baseline is the new round trip")
	})
	t.Run("a fixed target rises with its dependency's wait", func(t *testing.T) {
		fixed := cfg
		fixed.Baseline, fixed.Tolerance, fixed.Slack = 5*time.Millisecond, 1, 0
		wait := 20 * time.Millisecond
		fixed.DependencyWait = func() time.Duration { return wait }
		s := newSimLimit(fixed)
		require.Equal(t, 25*time.Millisecond, s.l.Target())
		for range 30 { // Redis 20 ms slower, the limiter's own part 4 ms
			s.window(int(s.l.Limit()), 24*time.Millisecond)
		}
		require.Greater(t, s.l.Limit(), int64(200), "under target: the limit grows")
		high := s.l.Limit()
		for range 30 { // the limiter's own queueing: 15 ms above the same Redis
			s.window(int(s.l.Limit()), 35*time.Millisecond)
		}
		require.Less(t, s.l.Limit(), high/4, "its own queueing still shrinks it")

		without := fixed
		without.DependencyWait = nil
		s = newSimLimit(without)
		require.Equal(t, 5*time.Millisecond, s.l.Target())
		for range 30 {
			s.window(int(s.l.Limit()), 24*time.Millisecond)
		}
		require.Less(t, s.l.Limit(), int64(64), "without it the same slower Redis shrinks the limit")
	})
}

// BenchmarkAdmission compares the engine's admission limit with
// failsafe-go's adaptivelimiter on the hot path: one permit taken and
// released per check, from 32 goroutines (go test -run '^$' -bench Admission ./pkg/limiter/).
func BenchmarkAdmission(b *testing.B) {
	b.Run("own", func(b *testing.B) {
		cfg := DefaultConfig()
		cfg.Max, cfg.Initial = 1<<20, 1<<20 // measure the cost, not refusals
		l := NewConcurrencyLimit(cfg, nil)
		var refused atomic.Int64
		b.SetParallelism(16)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if !l.Acquire() {
					refused.Add(1)
					continue
				}
				l.Release(time.Now())
			}
		})
		b.ReportMetric(float64(refused.Load())/float64(b.N), "refused/op")
	})
	b.Run("failsafe-go", func(b *testing.B) {
		l := adaptivelimiter.NewBuilder[any]().WithLimits(1, 1<<20, 1<<20).Build()
		var refused atomic.Int64
		b.SetParallelism(16)
		b.ResetTimer()
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				p, ok := l.TryAcquirePermit()
				if !ok {
					refused.Add(1)
					continue
				}
				p.Record()
			}
		})
		b.ReportMetric(float64(refused.Load())/float64(b.N), "refused/op")
	})
}
