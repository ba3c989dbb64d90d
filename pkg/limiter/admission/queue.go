package admission

import "time"

// Outcome is how a check that waited for a permit left the queue.
type Outcome uint8

const (
	// Admitted: the check holds a permit.
	Admitted Outcome = iota
	// Dropped: no permit in time — the queue was full, the check waited
	// its longest (MaxWait, or twice Target while the queue stands). The
	// engine answers it from local state (shed): busy is not down.
	Dropped
	// PastDeadline: the caller's deadline passed while the check waited;
	// nothing more is spent on it.
	PastDeadline
	// Canceled: the caller went away (its context was cancelled — Envoy
	// resets a call it stopped waiting for) while the check waited; nothing
	// more is spent on it.
	Canceled
)

func (o Outcome) String() string {
	switch o {
	case Admitted:
		return "admitted"
	case Dropped:
		return "dropped"
	case PastDeadline:
		return "past_deadline"
	case Canceled:
		return "canceled"
	}
	return "outcome(?)"
}

// QueueConfig shapes the wait for a permit when the limit is reached: CoDel
// (Nichols and Jacobson's controlled delay, as Facebook's Thrift servers apply
// it to a request queue) decides whether the queue *stands*, and while it
// stands the queue is served newest first (adaptive LIFO) and a waiter older
// than twice Target is dropped. A zero QueueConfig (MaxLen 0) is no queue:
// a check that finds the limit reached is dropped at once.
type QueueConfig struct {
	// Target: the queue stands when the shortest wait of a whole Interval
	// was longer than this (CoDel's target; 5 ms).
	Target time.Duration
	// Interval: how long the shortest wait is watched (CoDel's interval;
	// 100 ms).
	Interval time.Duration
	// MaxWait is the longest a check waits while the queue does not stand.
	MaxWait time.Duration
	// MaxLen bounds the waiters; a check finding it full is dropped.
	MaxLen int
}

// DefaultQueueConfig is the engine's queue for each shard's permits.
func DefaultQueueConfig() QueueConfig {
	return QueueConfig{Target: 5 * time.Millisecond, Interval: 100 * time.Millisecond, MaxWait: 20 * time.Millisecond, MaxLen: 1024}
}

// waiter is one check waiting for a permit.
type waiter struct {
	enq      time.Time
	deadline time.Time    // zero: none
	ch       chan Outcome // buffered (1): told exactly once
}

// lifoCoDel is the queue discipline alone, on a clock its caller passes in
// (pure logic: the caller holds the lock and reads the clock). Waiters are
// kept oldest first.
type lifoCoDel struct {
	cfg         QueueConfig
	q           []*waiter
	minWait     time.Duration // shortest wait seen in the current interval
	seen        bool          // minWait holds a wait of this interval
	intervalEnd time.Time
	standing    bool // the last interval's shortest wait exceeded Target
}

func newLIFOCoDel(cfg QueueConfig) *lifoCoDel { return &lifoCoDel{cfg: cfg} }

// observe records one wait (0 when the queue was found empty) and closes
// the interval when it is over: the queue stands when the shortest wait of
// the interval that ended exceeded Target.
func (c *lifoCoDel) observe(now time.Time, wait time.Duration) {
	c.tick(now)
	if !c.seen || wait < c.minWait {
		c.minWait, c.seen = wait, true
	}
}

// tick closes the interval when it is over.
func (c *lifoCoDel) tick(now time.Time) {
	if c.intervalEnd.IsZero() {
		c.intervalEnd = now.Add(c.cfg.Interval)
	}
	if !now.Before(c.intervalEnd) {
		c.standing = c.seen && c.minWait > c.cfg.Target
		c.seen = false
		c.intervalEnd = now.Add(c.cfg.Interval)
	}
}

// Standing reports whether the queue stands (served newest first).
func (c *lifoCoDel) Standing() bool { return c.standing }

// push queues w; false when the queue is full.
func (c *lifoCoDel) push(w *waiter) bool {
	if len(c.q) >= c.cfg.MaxLen {
		return false
	}
	if len(c.q) == 0 {
		c.observe(w.enq, 0) // the queue was empty: nothing stood
	}
	c.q = append(c.q, w)
	return true
}

// slough is the longest a waiter may have waited while the queue stands.
func (c *lifoCoDel) slough() time.Duration { return 2 * c.cfg.Target }

// next picks the waiter to hand a permit to at now, or nil when none is
// left. Waiters whose deadline has passed are handed to drop with
// PastDeadline; while the queue stands, waiters older than twice Target are
// handed to drop with Dropped and the newest is served, else the oldest.
func (c *lifoCoDel) next(now time.Time, drop func(*waiter, Outcome)) *waiter {
	c.tick(now)
	// The oldest end first: what is past its deadline, or too old to be
	// worth a permit while the queue stands, leaves.
	for len(c.q) > 0 {
		w := c.q[0]
		switch {
		case pastDeadline(w, now):
			drop(w, PastDeadline)
		case c.standing && now.Sub(w.enq) > c.slough():
			c.observe(now, now.Sub(w.enq))
			drop(w, Dropped)
		default:
			goto pick
		}
		c.q[0] = nil
		c.q = c.q[1:]
	}
	return nil
pick:
	for len(c.q) > 0 {
		var w *waiter
		if c.standing { // newest first
			w = c.q[len(c.q)-1]
			c.q[len(c.q)-1] = nil
			c.q = c.q[:len(c.q)-1]
		} else {
			w = c.q[0]
			c.q[0] = nil
			c.q = c.q[1:]
		}
		if pastDeadline(w, now) {
			drop(w, PastDeadline)
			continue
		}
		c.observe(now, now.Sub(w.enq))
		return w
	}
	return nil
}

// remove takes w out of the queue — its wait ran out, or (canceled) its
// caller went away; false when it was no longer there (handed a permit or
// dropped meanwhile). A wait that ran out is a wait the queue imposed and
// counts toward its standing; a caller that left may have been read late and
// waited here only a moment, which says nothing about the queue's delay
// (it would pull the interval's shortest wait down and keep a standing
// queue first-in-first-out).
func (c *lifoCoDel) remove(w *waiter, now time.Time, canceled bool) bool {
	for i, x := range c.q {
		if x == w {
			copy(c.q[i:], c.q[i+1:])
			c.q[len(c.q)-1] = nil
			c.q = c.q[:len(c.q)-1]
			if !canceled {
				c.observe(now, now.Sub(w.enq))
			}
			return true
		}
	}
	return false
}

// wait is how long w may wait from now before its timer takes it out: to
// its deadline, at most MaxWait (a standing queue drops it sooner, when a
// permit is handed on).
func (c *lifoCoDel) wait(w *waiter, now time.Time) time.Duration {
	d := c.cfg.MaxWait - now.Sub(w.enq)
	if !w.deadline.IsZero() {
		d = min(d, w.deadline.Sub(now))
	}
	return max(d, 0)
}

// Len is the number of waiters.
func (c *lifoCoDel) Len() int { return len(c.q) }

func pastDeadline(w *waiter, now time.Time) bool {
	return !w.deadline.IsZero() && !now.Before(w.deadline)
}
