package limiter

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// concurrencyLimit is an adaptive limit on the checks in flight to one Redis
// shard (queued for a pipeline or in one), in the manner of Netflix
// concurrency-limits' gradient limit: every window (100 ms, at least 10
// samples) the average round trip of the window is compared with a baseline —
// the smallest window average of the last few seconds — and
//
//	gradient = clamp(tolerance × (baseline + slack) / recent, 0.5, 1)
//	limit    = limit × (1 − smoothing) + (limit × gradient + √limit) × smoothing
//
// so the limit grows by about √limit while round trips stay near the baseline
// and shrinks (at most by half a window) when queueing makes them grow. A
// window in which fewer than half the permits were used leaves the limit
// alone (the load, not the limit, was the bound). A check that finds the limit
// reached is not queued: the engine answers it at once from local state.
//
// acquire and release are two atomic adds on the hot path; one goroutine per
// window takes the mutex to move the limit. Safe for concurrent use.
type concurrencyLimit struct {
	limit    atomic.Int64
	inflight atomic.Int64
	peak     atomic.Int64 // most in flight within the window
	sum, n   atomic.Int64 // round trips of the window, ns
	next     atomic.Int64 // when the window closes, ns since start
	start    time.Time
	since    func(time.Time) time.Duration // time.Since; tests move a clock

	mu       sync.Mutex
	est      float64   // the limit, unrounded
	mins     []float64 // window averages' minimum per baseline bucket, ns
	minsAt   int64     // when the current baseline bucket started
	cfg      admissionConfig
	onChange func(limit int64)
}

type admissionConfig struct {
	min, max, initial int64
	window            time.Duration
	minSamples        int64
	tolerance         float64
	slack             time.Duration // round trips below baseline+slack never shrink the limit
	smoothing         float64
	baselineBuckets   int           // baseline = min over this many buckets…
	baselineBucket    time.Duration // …of this length
}

func defaultAdmission() admissionConfig {
	return admissionConfig{min: 16, max: 1024, initial: 256, window: 100 * time.Millisecond, minSamples: 10,
		tolerance: 2, slack: time.Millisecond, smoothing: 0.5, baselineBuckets: 3, baselineBucket: time.Second}
}

func newConcurrencyLimit(cfg admissionConfig, onChange func(int64)) *concurrencyLimit {
	l := &concurrencyLimit{start: time.Now(), since: time.Since, est: float64(cfg.initial), cfg: cfg, onChange: onChange}
	l.limit.Store(cfg.initial)
	l.next.Store(int64(cfg.window))
	if onChange != nil {
		onChange(cfg.initial)
	}
	return l
}

// acquire takes a permit, or reports false when the limit is reached.
func (l *concurrencyLimit) acquire() bool {
	in := l.inflight.Add(1)
	if in > l.limit.Load() {
		l.inflight.Add(-1)
		return false
	}
	if in > l.peak.Load() {
		l.peak.Store(in) // racy max: a lost update only understates a peak
	}
	return true
}

// release returns a permit taken at start; the time since is its round trip
// (a check that timed out counts its full wait).
func (l *concurrencyLimit) release(start time.Time) {
	l.inflight.Add(-1)
	now := l.since(l.start)
	l.sum.Add(int64(now - start.Sub(l.start)))
	l.n.Add(1)
	if int64(now) >= l.next.Load() && l.mu.TryLock() {
		l.update(int64(now))
		l.mu.Unlock()
	}
}

// update closes a window; mu is held.
func (l *concurrencyLimit) update(now int64) {
	if now < l.next.Load() {
		return // another goroutine closed it
	}
	n := l.n.Load()
	if n < l.cfg.minSamples {
		l.next.Store(now + int64(l.cfg.window)/4)
		return
	}
	sum := l.sum.Swap(0)
	n = l.n.Swap(0)
	peak := l.peak.Swap(0)
	l.next.Store(now + int64(l.cfg.window))
	recent := float64(sum) / float64(max(n, 1))

	// Baseline: the smallest window average over the last few buckets.
	if len(l.mins) == 0 || now-l.minsAt >= int64(l.cfg.baselineBucket) {
		if len(l.mins) == l.cfg.baselineBuckets {
			copy(l.mins, l.mins[1:])
			l.mins = l.mins[:len(l.mins)-1]
		}
		l.mins = append(l.mins, recent)
		l.minsAt = now
	} else if recent < l.mins[len(l.mins)-1] {
		l.mins[len(l.mins)-1] = recent
	}
	base := l.mins[0]
	for _, m := range l.mins[1:] {
		base = min(base, m)
	}

	if float64(peak) < l.est/2 {
		return // the load, not the limit, bounded the window
	}
	gradient := min(1, max(0.5, l.cfg.tolerance*(base+float64(l.cfg.slack))/recent))
	next := l.est*gradient + math.Sqrt(l.est)
	l.est = l.est*(1-l.cfg.smoothing) + next*l.cfg.smoothing
	l.est = min(max(l.est, float64(l.cfg.min)), float64(l.cfg.max))
	if v := int64(l.est); v != l.limit.Load() {
		l.limit.Store(v)
		if l.onChange != nil {
			l.onChange(v)
		}
	}
}

// Limit is the current limit.
func (l *concurrencyLimit) Limit() int64 { return l.limit.Load() }
