package admission

import (
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fakeQueue drives the queue discipline on a clock the test moves.
type fakeQueue struct {
	c       *lifoCoDel
	now     time.Time
	dropped map[*waiter]Outcome
}

func newFakeQueue() *fakeQueue {
	return &fakeQueue{c: newLIFOCoDel(DefaultQueueConfig()), now: time.Unix(1_000_000, 0), dropped: map[*waiter]Outcome{}}
}

func (f *fakeQueue) push(deadline time.Duration) *waiter {
	w := &waiter{enq: f.now}
	if deadline > 0 {
		w.deadline = f.now.Add(deadline)
	}
	if !f.c.push(w) {
		return nil
	}
	return w
}

func (f *fakeQueue) next() *waiter {
	return f.c.next(f.now, func(w *waiter, o Outcome) { f.dropped[w] = o })
}

func (f *fakeQueue) advance(d time.Duration) { f.now = f.now.Add(d) }

// TestQueueFIFOUntilItStands: a queue that drains within Target is served
// oldest first, interval after interval.
func TestQueueFIFOUntilItStands(t *testing.T) {
	f := newFakeQueue()
	for range 5 { // five intervals in which every wait is short
		a, b := f.push(0), f.push(0)
		f.advance(time.Millisecond)
		require.Same(t, a, f.next(), "oldest first")
		require.Same(t, b, f.next())
		require.Nil(t, f.next(), "empty")
		f.advance(30 * time.Millisecond)
	}
	require.False(t, f.c.Standing())
	require.Empty(t, f.dropped)
}

// standUp makes the queue stand: a whole interval in which even the shortest
// wait exceeded Target.
func standUp(t *testing.T, f *fakeQueue) {
	t.Helper()
	cfg := f.c.cfg
	for f.c.Standing() == false {
		f.push(0)
		f.advance(cfg.Target + time.Millisecond) // every wait over Target…
		f.push(0)
		require.NotNil(t, f.next())
		f.advance(cfg.Interval / 4)
	}
	for f.c.Len() > 0 { // leave an empty queue, still standing
		f.c.q = f.c.q[1:]
	}
}

// TestQueueStandsThenServesNewestFirst: once the shortest wait of an
// interval exceeds Target the queue stands — the newest waiter is served
// first, and waiters older than twice Target are dropped (shed) instead of
// taking a permit that could answer a caller still waiting.
func TestQueueStandsThenServesNewestFirst(t *testing.T) {
	f := newFakeQueue()
	standUp(t, f)
	old := f.push(0)
	f.advance(11 * time.Millisecond) // past 2 × Target
	mid := f.push(0)
	f.advance(time.Millisecond)
	young := f.push(0)
	f.advance(time.Millisecond)

	require.Same(t, young, f.next(), "newest first while the queue stands")
	require.Equal(t, Dropped, f.dropped[old], "older than twice Target: dropped")
	require.Same(t, mid, f.next())
	require.Nil(t, f.next())
}

// TestQueueLetsGoWhenItDrains: a standing queue that is found empty for an
// interval stops standing and is FIFO again.
func TestQueueLetsGoWhenItDrains(t *testing.T) {
	f := newFakeQueue()
	standUp(t, f)
	f.advance(time.Millisecond)
	a := f.push(0) // pushed into an empty queue: a wait of 0 is seen
	f.advance(f.c.cfg.Interval + time.Millisecond)
	b := f.push(0)
	// a has waited over the interval; the interval that just closed saw a
	// wait of 0 (the empty queue), so the queue no longer stands.
	got := f.next()
	require.False(t, f.c.Standing())
	require.Same(t, a, got, "FIFO again")
	require.Same(t, b, f.next())
}

// TestQueueDropsPastDeadline: a waiter whose caller's deadline has passed is
// never handed a permit, wherever it is in the queue and whatever the mode.
func TestQueueDropsPastDeadline(t *testing.T) {
	for _, standing := range []bool{false, true} {
		f := newFakeQueue()
		if standing {
			standUp(t, f)
		}
		a := f.push(3 * time.Millisecond)
		b := f.push(0)
		c := f.push(2 * time.Millisecond)
		f.advance(4 * time.Millisecond)
		got := []*waiter{f.next(), f.next()}
		require.ElementsMatch(t, []*waiter{b, nil}, got, "standing %v", standing)
		require.Equal(t, PastDeadline, f.dropped[a])
		require.Equal(t, PastDeadline, f.dropped[c])
	}
}

// TestQueueStandsThroughCancellations: a caller that leaves a standing
// queue after a moment (read late, it gave up soon after) does not count as
// a short wait: the waits served still decide, and the queue keeps standing.
// Counted, its 1 ms would be the interval's shortest and the queue would go
// back to first-in-first-out under load.
func TestQueueStandsThroughCancellations(t *testing.T) {
	f := newFakeQueue()
	cfg := f.c.cfg
	f.c.standing, f.c.seen, f.c.intervalEnd = true, false, f.now.Add(cfg.Interval)
	waiting := &waiter{enq: f.now} // a waiter already queued, never observed as empty
	f.c.q = append(f.c.q, waiting)
	f.advance(time.Millisecond)
	gone := f.push(0)
	f.advance(time.Millisecond)
	require.True(t, f.c.remove(gone, f.now, true), "its caller went away")
	f.advance(cfg.Target)
	require.Same(t, waiting, f.next(), "served after Target + 2 ms")
	f.advance(cfg.Interval)
	f.next() // the interval closes
	require.True(t, f.c.Standing(), "the shortest wait served exceeded Target")
}

// TestQueueIsBounded: a full queue refuses; a waiter's wait is bounded by
// MaxWait and by its deadline.
func TestQueueIsBounded(t *testing.T) {
	f := newFakeQueue()
	f.c.cfg.MaxLen = 2
	require.NotNil(t, f.push(0))
	w := f.push(5 * time.Millisecond)
	require.NotNil(t, w)
	require.Nil(t, f.push(0), "full")
	require.Equal(t, 5*time.Millisecond, f.c.wait(w, f.now))
	require.Equal(t, f.c.cfg.MaxWait, f.c.wait(f.c.q[0], f.now))
	f.advance(time.Hour)
	require.Zero(t, f.c.wait(w, f.now))
	require.True(t, f.c.remove(w, f.now, false))
	require.False(t, f.c.remove(w, f.now, false), "already gone")
}

// TestAcquireWaitHandsPermitsOn: at its limit a ConcurrencyLimit queues
// checks and hands each released permit to a waiter — newest first while the
// queue stands — and never lets more permits out than its limit.
func TestAcquireWaitHandsPermitsOn(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min = 1, 1
	cfg.Queue.MaxWait = time.Hour // the test releases; no timer decides
	now := time.Duration(0)
	l := NewConcurrencyLimit(cfg, nil)
	l.since = func(time.Time) time.Duration { return now }
	require.True(t, l.Acquire())

	got := make(chan int, 3)
	for i := range 3 {
		go func() {
			require.Equal(t, Admitted, l.AcquireWait(nil, time.Time{}))
			got <- i
		}()
		require.Eventually(t, func() bool { return l.Waiting() == int64(i+1) }, 10*time.Second, time.Millisecond)
	}
	l.qmu.Lock()
	l.queue.standing = true // as after an interval whose shortest wait exceeded Target
	l.qmu.Unlock()
	for want := 2; want >= 0; want-- {
		l.Release(l.start.Add(now))
		require.Equal(t, want, <-got, "newest first")
		require.Equal(t, int64(1), l.inflight.Load(), "the permit was handed on, not added")
	}
	l.Release(l.start.Add(now))
	require.Zero(t, l.inflight.Load())
}

// TestAcquireWaitPastDeadline: a check arriving past its deadline is told so
// at once and takes nothing; without a queue a check at the limit is dropped.
func TestAcquireWaitPastDeadline(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min = 1, 1
	l := NewConcurrencyLimit(cfg, nil)
	require.True(t, l.Acquire())
	require.Equal(t, PastDeadline, l.AcquireWait(nil, time.Now().Add(-time.Millisecond)))
	require.Zero(t, l.Waiting())

	cfg.Queue = QueueConfig{}
	l = NewConcurrencyLimit(cfg, nil)
	require.True(t, l.Acquire())
	require.Equal(t, Dropped, l.AcquireWait(nil, time.Time{}))
	require.Equal(t, int64(1), l.inflight.Load())
}

// TestAcquireWaitNeverOverAdmits: many checks racing for a few permits
// through the queue never hold more than the limit, and every permit comes
// back.
func TestAcquireWaitNeverOverAdmits(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.Max = 4, 4, 4
	l := NewConcurrencyLimit(cfg, nil)
	var held, peak atomic.Int64
	var wg sync.WaitGroup
	for range 32 {
		wg.Go(func() {
			for range 300 {
				if l.AcquireWait(nil, time.Time{}) != Admitted {
					continue
				}
				if h := held.Add(1); h > peak.Load() {
					peak.Store(h)
				}
				runtime.Gosched()
				held.Add(-1)
				l.Release(time.Now())
			}
		})
	}
	wg.Wait()
	require.LessOrEqual(t, peak.Load(), int64(4))
	require.Zero(t, l.inflight.Load())
	require.Zero(t, l.Waiting())
}

// TestAcquireWaitCanceled: a waiter whose caller goes away leaves the queue
// at once (Canceled), takes no permit, and the next release goes to the
// waiter behind it.
func TestAcquireWaitCanceled(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min = 1, 1
	cfg.Queue.MaxWait = time.Hour // only the cancellation or a release ends a wait
	l := NewConcurrencyLimit(cfg, nil)
	require.True(t, l.Acquire())

	gone := make(chan struct{})
	first := make(chan Outcome, 1)
	go func() { first <- l.AcquireWait(gone, time.Time{}) }()
	require.Eventually(t, func() bool { return l.Waiting() == 1 }, 10*time.Second, time.Millisecond)
	second := make(chan Outcome, 1)
	go func() { second <- l.AcquireWait(nil, time.Time{}) }()
	require.Eventually(t, func() bool { return l.Waiting() == 2 }, 10*time.Second, time.Millisecond)

	close(gone)
	require.Equal(t, Canceled, <-first)
	require.Equal(t, int64(1), l.Waiting())
	require.Equal(t, int64(1), l.inflight.Load(), "the cancelled waiter took no permit")
	l.Release(time.Now())
	require.Equal(t, Admitted, <-second, "the permit went to the waiter that stayed")
	l.Release(time.Now())
	require.Zero(t, l.inflight.Load())
	require.Equal(t, "canceled", Canceled.String())
}

// TestLimitGrowsWhileAQueueStands: a limit whose permits are all handed
// from call to call (a standing queue, no Acquire) still reads them as
// used, and grows while calls finish under their target, handing the new
// room to the queue at once — a limit that shrank under a passing spike
// recovers with the queue still there.
func TestLimitGrowsWhileAQueueStands(t *testing.T) {
	cfg := DefaultConfig()
	cfg.Initial, cfg.Min, cfg.Max = 8, 8, 64
	cfg.Baseline, cfg.Tolerance, cfg.Slack = 10*time.Millisecond, 1, 0
	// nothing leaves the queue but by a permit: the test's clock jumps
	cfg.Queue = QueueConfig{Target: time.Hour, Interval: time.Hour, MaxWait: time.Hour, MaxLen: 1024}
	var now atomic.Int64 // the limit's clock, ns since its start
	l := NewConcurrencyLimit(cfg, nil)
	l.since = func(time.Time) time.Duration { return time.Duration(now.Load()) }
	for range 8 {
		require.True(t, l.Acquire())
	}
	const waiters = 300
	admitted := make(chan struct{}, waiters)
	for range waiters {
		go func() {
			if l.AcquireWait(nil, time.Time{}) == Admitted {
				admitted <- struct{}{}
			}
		}()
	}
	require.Eventually(t, func() bool { return l.Waiting() == waiters }, 10*time.Second, time.Millisecond)
	for range 20 { // 20 windows of 12 calls, each holding its permit 2 ms of a 10 ms target
		for range 12 {
			start := l.start.Add(time.Duration(now.Load()))
			now.Add(int64(2 * time.Millisecond))
			l.Release(start)
			<-admitted // handed on
		}
		now.Add(int64(cfg.Window))
	}
	require.Greater(t, l.Limit(), int64(20), "the limit grew window after window while permits were handed on")
	require.Equal(t, l.Limit(), l.InFlight(), "the queue was given the room as it grew")
}
