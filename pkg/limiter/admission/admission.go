package admission

import (
	"math"
	"sync"
	"sync/atomic"
	"time"
)

// ConcurrencyLimit is an adaptive limit on the checks in flight to one Redis
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
// reached waits for a permit in a short queue (AcquireWait, QueueConfig:
// adaptive LIFO with CoDel) or, when it gets none in time, is answered from
// local state by the engine.
//
// Acquire and Release are two atomic adds on the hot path; one goroutine per
// window takes the mutex to move the limit. Safe for concurrent use.
type ConcurrencyLimit struct {
	limit    atomic.Int64
	inflight atomic.Int64
	peak     atomic.Int64 // most in flight within the window
	sum, n   atomic.Int64 // round trips of the window, ns
	next     atomic.Int64 // when the window closes, ns since start
	start    time.Time
	since    func(time.Time) time.Duration // time.Since; tests move a clock

	waiting atomic.Int64 // checks in queue (qmu guards the queue itself)
	qmu     sync.Mutex
	queue   *lifoCoDel // nil: no queue (cfg.Queue.MaxLen 0)
	now     func() time.Time

	mu       sync.Mutex
	est      float64   // the limit, unrounded
	mins     []float64 // window averages' minimum per baseline bucket, ns
	minsAt   int64     // when the current baseline bucket started
	cfg      Config
	onChange func(limit int64)
}

// Config shapes a ConcurrencyLimit (DefaultConfig is the engine's).
type Config struct {
	Min, Max, Initial int64
	Window            time.Duration
	MinSamples        int64
	Tolerance         float64
	Slack             time.Duration // round trips below baseline+slack never shrink the limit
	Smoothing         float64
	BaselineBuckets   int           // baseline = min over this many buckets…
	BaselineBucket    time.Duration // …of this length
	// Baseline, when set, is the baseline instead of the measured one: the
	// limit then keeps the average time a permit is held near Tolerance ×
	// (Baseline + Slack) — a latency target, for a limit in front of work
	// whose unloaded time cannot be measured under load (a CPU quota's
	// stalls inflate every window's average alike).
	Baseline time.Duration
	// DependencyWait, with Baseline, is added to it each window: the least
	// time a permit spends waiting on a dependency the limit cannot speed
	// up (for the gRPC entry gate, Redis's round trip: its floor,
	// redisx.RoundTripFloor), so that a slower dependency raises the target
	// instead of shrinking the limit. Nil: none.
	DependencyWait func() time.Duration
	// Queue is the wait for a permit when the limit is reached (adaptive
	// LIFO with CoDel); zero: none, a check is refused at once.
	Queue QueueConfig
}

// DefaultConfig is the limit every Redis shard starts with.
func DefaultConfig() Config {
	return Config{Min: 16, Max: 1024, Initial: 256, Window: 100 * time.Millisecond, MinSamples: 10,
		Tolerance: 2, Slack: time.Millisecond, Smoothing: 0.5, BaselineBuckets: 3, BaselineBucket: time.Second,
		Queue: DefaultQueueConfig()}
}

// NewConcurrencyLimit returns a limit at cfg.Initial; onChange, when set,
// hears every new limit.
func NewConcurrencyLimit(cfg Config, onChange func(int64)) *ConcurrencyLimit {
	l := &ConcurrencyLimit{start: time.Now(), since: time.Since, est: float64(cfg.Initial), cfg: cfg, onChange: onChange}
	l.now = func() time.Time { return l.start.Add(l.since(l.start)) }
	if cfg.Queue.MaxLen > 0 {
		l.queue = newLIFOCoDel(cfg.Queue)
	}
	l.limit.Store(cfg.Initial)
	l.next.Store(int64(cfg.Window))
	if onChange != nil {
		onChange(cfg.Initial)
	}
	return l
}

// Acquire takes a permit, or reports false when the limit is reached.
func (l *ConcurrencyLimit) Acquire() bool {
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

// Take takes a permit even when the limit is reached, for the calls that
// are never queued (CRITICAL at a server's entry); it is released as any
// other.
func (l *ConcurrencyLimit) Take() {
	if in := l.inflight.Add(1); in > l.peak.Load() {
		l.peak.Store(in)
	}
}

// AcquireWait takes a permit, waiting for one in the queue (adaptive LIFO
// with CoDel, QueueConfig) when the limit is reached, at most until deadline
// (zero: none) and while done (the caller's ctx.Done(); nil: never) is
// open. Without a queue it is Acquire: Admitted or Dropped.
func (l *ConcurrencyLimit) AcquireWait(done <-chan struct{}, deadline time.Time) Outcome {
	if l.Acquire() {
		return Admitted
	}
	if l.queue == nil {
		return Dropped
	}
	now := l.now()
	w := &waiter{enq: now, deadline: deadline, ch: make(chan Outcome, 1)}
	if pastDeadline(w, now) {
		return PastDeadline
	}
	l.qmu.Lock()
	l.waiting.Add(1)
	if l.Acquire() { // a permit came back meanwhile
		l.waiting.Add(-1)
		l.qmu.Unlock()
		return Admitted
	}
	if !l.queue.push(w) {
		l.waiting.Add(-1)
		l.qmu.Unlock()
		return Dropped
	}
	d := l.queue.wait(w, now)
	l.qmu.Unlock()
	t := time.NewTimer(d)
	left := Dropped
	select {
	case o := <-w.ch:
		t.Stop()
		return o
	case <-t.C:
	case <-done:
		t.Stop()
		left = Canceled
	}
	l.qmu.Lock()
	now = l.now()
	if l.queue.remove(w, now, left == Canceled) {
		l.waiting.Add(-1)
		l.qmu.Unlock()
		if pastDeadline(w, now) {
			return PastDeadline
		}
		return left
	}
	l.qmu.Unlock()
	return <-w.ch // handed a permit, or dropped, as the timer fired
}

// Waiting is the number of checks queued for a permit.
func (l *ConcurrencyLimit) Waiting() int64 { return l.waiting.Load() }

// InFlight is how many permits are held.
func (l *ConcurrencyLimit) InFlight() int64 { return l.inflight.Load() }

// Standing reports whether the permit queue stands (served newest first).
func (l *ConcurrencyLimit) Standing() bool {
	if l.queue == nil {
		return false
	}
	l.qmu.Lock()
	defer l.qmu.Unlock()
	return l.queue.Standing()
}

// handOff gives a permit the caller holds to the next waiter the queue
// discipline picks; false when there is none (or the limit has shrunk below
// the permits out), and the caller keeps it.
func (l *ConcurrencyLimit) handOff() bool {
	if l.inflight.Load() > l.limit.Load() {
		return false
	}
	l.qmu.Lock()
	defer l.qmu.Unlock()
	w := l.queue.next(l.now(), func(d *waiter, o Outcome) {
		l.waiting.Add(-1)
		d.ch <- o
	})
	if w == nil {
		return false
	}
	l.waiting.Add(-1)
	w.ch <- Admitted
	return true
}

// Release returns a permit taken at start — to the next waiter when checks
// queue for one; the time since start is its round trip (a check that timed
// out counts its full wait).
func (l *ConcurrencyLimit) Release(start time.Time) {
	switch {
	case l.waiting.Load() > 0 && l.handOff():
	default:
		l.inflight.Add(-1)
		// A check may have queued between the look at waiting and the
		// release: take the permit back for it.
		if l.waiting.Load() > 0 && l.Acquire() && !l.handOff() {
			l.inflight.Add(-1)
		}
	}
	now := l.since(l.start)
	l.sum.Add(int64(now - start.Sub(l.start)))
	l.n.Add(1)
	if int64(now) >= l.next.Load() && l.mu.TryLock() {
		l.update(int64(now))
		l.mu.Unlock()
	}
}

// update closes a window; mu is held.
func (l *ConcurrencyLimit) update(now int64) {
	if now < l.next.Load() {
		return // another goroutine closed it
	}
	n := l.n.Load()
	if n < l.cfg.MinSamples {
		l.next.Store(now + int64(l.cfg.Window)/4)
		return
	}
	sum := l.sum.Swap(0)
	n = l.n.Swap(0)
	// A permit handed from one call to the next (a standing queue) is
	// taken without Acquire: what is held now is a peak too, else a limit
	// that shrank while a queue stood would read its own bound as light
	// load and never grow back.
	peak := max(l.peak.Swap(0), l.inflight.Load())
	l.next.Store(now + int64(l.cfg.Window))
	recent := float64(sum) / float64(max(n, 1))

	// Baseline: the smallest window average over the last few buckets.
	if len(l.mins) == 0 || now-l.minsAt >= int64(l.cfg.BaselineBucket) {
		if len(l.mins) == l.cfg.BaselineBuckets {
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
	if l.cfg.Baseline > 0 {
		base = float64(l.target())
	}

	if float64(peak) < l.est/2 {
		return // the load, not the limit, bounded the window
	}
	gradient := min(1, max(0.5, l.cfg.Tolerance*(base+float64(l.cfg.Slack))/recent))
	next := l.est*gradient + math.Sqrt(l.est)
	l.est = l.est*(1-l.cfg.Smoothing) + next*l.cfg.Smoothing
	l.est = min(max(l.est, float64(l.cfg.Min)), float64(l.cfg.Max))
	if v := int64(l.est); v != l.limit.Load() {
		l.limit.Store(v)
		if l.onChange != nil {
			l.onChange(v)
		}
		// Room the queue is waiting for: hand it out now, not only as
		// permits come back (which hand on one each, never more).
		for l.waiting.Load() > 0 && l.Acquire() {
			if !l.handOff() {
				l.inflight.Add(-1)
				break
			}
		}
	}
}

// target is the fixed baseline, with the dependency's wait.
func (l *ConcurrencyLimit) target() time.Duration {
	if l.cfg.DependencyWait == nil {
		return l.cfg.Baseline
	}
	return l.cfg.Baseline + max(l.cfg.DependencyWait(), 0)
}

// Target is the average time a permit is held that the limit aims at —
// Tolerance × (Baseline + DependencyWait + Slack) — or 0 when its baseline
// is measured instead.
func (l *ConcurrencyLimit) Target() time.Duration {
	if l.cfg.Baseline <= 0 {
		return 0
	}
	return time.Duration(l.cfg.Tolerance * float64(l.target()+l.cfg.Slack))
}

// Limit is the current limit.
func (l *ConcurrencyLimit) Limit() int64 { return l.limit.Load() }

// MarkStanding makes the permit queue stand until its interval next closes,
// as an interval whose shortest wait exceeded Target does: for tests of what
// a standing queue does outside this package.
func (l *ConcurrencyLimit) MarkStanding() {
	if l.queue == nil {
		return
	}
	l.qmu.Lock()
	defer l.qmu.Unlock()
	now := l.now()
	l.queue.tick(now)
	l.queue.standing = true
	l.queue.seen, l.queue.minWait = true, l.queue.cfg.Target+1 // the interval under way stands too
}
