package limiter

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// remaining is what Redis says is left of p's bucket after one more check.
func remaining(t *testing.T, e *Engine, p events.Principal) int {
	t.Helper()
	r := check(t, e, Request{Principal: p, Cost: 1})
	require.False(t, r.Degraded)
	return r.Remaining
}

// TestPastDeadlineOnArrivalCostsNothing: a check reaching the engine after its
// caller's deadline is not decided (ErrPastDeadline, its priority known for
// the metric) and Redis counts nothing of it.
func TestPastDeadlineOnArrivalCostsNothing(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, oneBucket, nil)
	p := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "late")}
	res, err := e.Check(context.Background(), Request{Principal: p, Method: "GET", Route: "/x", Cost: 1, Deadline: time.Now().Add(-time.Millisecond)})
	require.ErrorIs(t, err, ErrPastDeadline)
	require.Equal(t, admission.DefaultPriority, res.Priority)
	require.Equal(t, 4, remaining(t, e, p), "the late check took nothing: the first counted one leaves 4 of 5")

	res = check(t, e, Request{Principal: p, Cost: 1, Deadline: time.Now().Add(time.Minute)})
	require.Equal(t, 3, res.Remaining, "a check inside its deadline is decided as any")
}

// TestPastDeadlineInThePipelineQueue: a check whose deadline passes while it
// waits for a pipeline is answered ErrPastDeadline and never sent to Redis.
func TestPastDeadlineInThePipelineQueue(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, oneBucket, nil)
	b := e.shards.single.batch
	release := b.gc.Hold() // every flusher busy: checks queue for a pipeline
	p := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "queued")}
	deadline := time.Now().Add(30 * time.Millisecond)
	errc := make(chan error, 1)
	go func() {
		_, err := e.Check(context.Background(), Request{Principal: p, Method: "GET", Route: "/x", Cost: 1, Deadline: deadline})
		errc <- err
	}()
	require.Eventually(t, func() bool { return b.gc.Queued() == 1 }, 10*time.Second, time.Millisecond)
	time.Sleep(time.Until(deadline) + time.Millisecond) // the deadline passes in the queue
	release()
	require.ErrorIs(t, <-errc, ErrPastDeadline)
	require.Equal(t, 4, remaining(t, e, p), "never sent: Redis counted nothing")
}

// TestStandingQueueAnswersNewestFirst, against Redis: with a shard's
// permits taken and its queue standing, a released permit goes to the newest
// check, whose Redis round trip comes first (it sees the most remaining); a
// queued check whose deadline passes is never sent.
func TestStandingQueueAnswersNewestFirst(t *testing.T) {
	rdb := redistest.Client(t)
	adm := admission.DefaultConfig()
	adm.Initial, adm.Min, adm.Max = 1, 1, 1
	adm.Queue.Target = time.Hour // nothing is too old to serve: the order alone is tested
	adm.Queue.MaxWait = time.Hour
	adm.Queue.Interval = time.Hour // the queue stands as marked for the whole test
	e := newTestEngine(t, rdb, oneBucket, func(c *EngineConfig) { c.admission = &adm })
	lim := e.shards.single.adm
	require.True(t, lim.Acquire()) // the one permit, held by the test

	p := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "lifo")}
	type out struct {
		i   int
		res Result
		err error
	}
	outs := make(chan out, 4)
	late := time.Now().Add(50 * time.Millisecond)
	for i := range 4 {
		var deadline time.Time
		if i == 1 {
			deadline = late // the second check's caller gives up while it waits
		}
		go func() {
			res, err := e.Check(context.Background(), Request{Principal: p, Method: "GET", Route: "/x", Cost: 1, Deadline: deadline})
			outs <- out{i, res, err}
		}()
		require.Eventually(t, func() bool { return lim.Waiting() == int64(i+1) }, 10*time.Second, time.Millisecond)
	}
	lim.MarkStanding()
	time.Sleep(time.Until(late) + time.Millisecond)
	lim.Release(time.Now()) // each check hands the permit on when it is done

	var order []int
	byIndex := map[int]out{}
	for range 4 {
		o := <-outs
		byIndex[o.i] = o
		if o.err == nil {
			order = append(order, o.i)
		}
	}
	require.Equal(t, []int{3, 2, 0}, order, "newest first; the late one never decided")
	require.ErrorIs(t, byIndex[1].err, ErrPastDeadline)
	require.Equal(t, 4, byIndex[3].res.Remaining, "the newest went to Redis first")
	require.Equal(t, 3, byIndex[2].res.Remaining)
	require.Equal(t, 2, byIndex[0].res.Remaining, "the oldest last")
	require.False(t, byIndex[0].res.Degraded)
}

// TestCanceledWhileWaitingForAPermitCostsNothing: a check whose caller goes
// away (its context cancelled, as when Envoy resets the call) while it waits
// for a shard's permit leaves the queue at once with context.Canceled, and
// Redis counts nothing of it.
func TestCanceledWhileWaitingForAPermitCostsNothing(t *testing.T) {
	rdb := redistest.Client(t)
	adm := admission.DefaultConfig()
	adm.Initial, adm.Min, adm.Max = 1, 1, 1
	adm.Queue.MaxWait = time.Hour // only the cancellation can end the wait
	e := newTestEngine(t, rdb, oneBucket, func(c *EngineConfig) { c.admission = &adm })
	lim := e.shards.single.adm
	require.True(t, lim.Acquire()) // the one permit, held by the test

	p := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "gone")}
	ctx, cancel := context.WithCancel(context.Background())
	errc := make(chan error, 1)
	go func() {
		_, err := e.Check(ctx, Request{Principal: p, Method: "GET", Route: "/x", Cost: 1})
		errc <- err
	}()
	require.Eventually(t, func() bool { return lim.Waiting() == 1 }, 10*time.Second, time.Millisecond)
	cancel()
	select {
	case err := <-errc:
		require.ErrorIs(t, err, context.Canceled)
	case <-time.After(10 * time.Second):
		t.Fatal("the cancelled check still waits for a permit")
	}
	require.Zero(t, lim.Waiting())
	lim.Release(time.Now())
	require.Equal(t, 4, remaining(t, e, p), "never sent: Redis counted nothing")
}

// TestCriticalCheckIsNeverQueuedForAPermit: with the shard's one permit
// held, a CRITICAL check (its own priority) is decided at once and gives its
// permit back, while another check waits in the queue.
func TestCriticalCheckIsNeverQueuedForAPermit(t *testing.T) {
	rdb := redistest.Client(t)
	adm := admission.DefaultConfig()
	adm.Initial, adm.Min, adm.Max = 1, 1, 1
	adm.Queue.MaxWait = time.Hour
	e := newTestEngine(t, rdb, oneBucket, func(c *EngineConfig) { c.admission = &adm })
	lim := e.shards.single.adm
	require.True(t, lim.Acquire()) // the one permit, held by the test

	waiter := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "waits")}
	errc := make(chan error, 1)
	go func() {
		_, err := e.Check(context.Background(), Request{Principal: waiter, Method: "GET", Route: "/x", Cost: 1})
		errc <- err
	}()
	require.Eventually(t, func() bool { return lim.Waiting() == 1 }, 10*time.Second, time.Millisecond)

	critical := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "critical")}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	r, err := e.Check(ctx, Request{Principal: critical, Method: "GET", Route: "/x", Cost: 1, Priority: admission.PriorityCritical})
	require.NoError(t, err, "decided while the permit was held")
	require.True(t, r.Allowed)
	require.False(t, r.Degraded)
	require.Equal(t, int64(1), lim.Waiting(), "the other check still waits")
	require.Equal(t, int64(1), lim.InFlight(), "the CRITICAL check's permit is given back")

	lim.Release(time.Now())
	require.NoError(t, <-errc)
}
