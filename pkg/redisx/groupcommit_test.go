package redisx_test

import (
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

type gcItem struct {
	id   int
	done chan struct{}
	hits atomic.Int32 // times a pipeline answered it
}

func newGC(max, flushers int, flush func([]*gcItem)) *redisx.GroupCommit[*gcItem] {
	return &redisx.GroupCommit[*gcItem]{Max: max, Flushers: flushers, Flush: flush,
		Done: func(it *gcItem) bool {
			select {
			case <-it.done:
				return true
			default:
				return false
			}
		}}
}

func answer(batch []*gcItem) {
	for _, it := range batch {
		it.hits.Add(1)
		close(it.done)
	}
}

// TestGroupCommitAnswersEveryItemOnce: 2,000 concurrent items each answered
// exactly once, in pipelines of at most Max, never more than Flushers in
// flight, and far fewer pipelines than items.
func TestGroupCommitAnswersEveryItemOnce(t *testing.T) {
	t.Parallel()
	var inFlight, most, pipelines atomic.Int32
	var biggest atomic.Int32
	g := newGC(16, 3, func(batch []*gcItem) {
		n := inFlight.Add(1)
		for m := most.Load(); n > m && !most.CompareAndSwap(m, n); m = most.Load() {
		}
		for b := biggest.Load(); int32(len(batch)) > b && !biggest.CompareAndSwap(b, int32(len(batch))); b = biggest.Load() {
		}
		pipelines.Add(1)
		time.Sleep(200 * time.Microsecond) // a round trip
		inFlight.Add(-1)
		answer(batch)
	})
	const n = 2000
	items := make([]*gcItem, n)
	var wg sync.WaitGroup
	for i := range n {
		items[i] = &gcItem{id: i, done: make(chan struct{})}
		wg.Add(1)
		go func() {
			defer wg.Done()
			require.True(t, g.Add(items[i]))
			<-items[i].done
		}()
	}
	wg.Wait()
	for _, it := range items {
		require.Equal(t, int32(1), it.hits.Load(), "item %d", it.id)
	}
	require.LessOrEqual(t, biggest.Load(), int32(16), "no pipeline over Max")
	require.LessOrEqual(t, most.Load(), int32(3), "never more than Flushers in flight")
	require.Less(t, pipelines.Load(), int32(n/2), "items shared pipelines")
	require.Zero(t, g.Queued())
}

// TestGroupCommitUsesFreeSlotsAtOnce: while one pipeline is in flight, an
// item that finds a free slot goes out at once in a pipeline of its own (a
// slow link keeps several in flight); with every slot taken it waits.
func TestGroupCommitUsesFreeSlotsAtOnce(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	var inFlight atomic.Int32
	g := newGC(64, 2, func(batch []*gcItem) {
		inFlight.Add(1)
		<-release
		inFlight.Add(-1)
		answer(batch)
	})
	item := func() *gcItem { return &gcItem{done: make(chan struct{})} }
	first, second, third := item(), item(), item()
	go g.Add(first)
	require.Eventually(t, func() bool { return inFlight.Load() == 1 }, 2*time.Second, time.Millisecond)
	go g.Add(second)
	require.Eventually(t, func() bool { return inFlight.Load() == 2 }, 2*time.Second, time.Millisecond, "a free slot sends at once")
	go g.Add(third)
	require.Eventually(t, func() bool { return g.Queued() == 1 }, 2*time.Second, time.Millisecond)
	time.Sleep(20 * time.Millisecond)
	require.Equal(t, int32(2), inFlight.Load(), "never more than Flushers in flight")
	close(release)
	for _, it := range []*gcItem{first, second, third} {
		select {
		case <-it.done:
		case <-time.After(2 * time.Second):
			t.Fatal("an item was never answered")
		}
	}
}

// TestGroupCommitQueueBound: with every slot held, Add queues up to MaxQueue
// and refuses beyond; Remove takes an unsent item out; release sends the rest.
func TestGroupCommitQueueBound(t *testing.T) {
	t.Parallel()
	g := newGC(64, 4, answer)
	g.MaxQueue = 2
	release := g.Hold()
	a, b, c := &gcItem{done: make(chan struct{})}, &gcItem{done: make(chan struct{})}, &gcItem{done: make(chan struct{})}
	require.True(t, g.Add(a))
	require.True(t, g.Add(b))
	require.False(t, g.Add(c), "the queue is full")
	require.True(t, g.Remove(b))
	require.False(t, g.Remove(b), "already out")
	require.Equal(t, 1, g.Queued())
	release()
	select {
	case <-a.done:
	case <-time.After(2 * time.Second):
		t.Fatal("release did not send what was queued")
	}
	require.Zero(t, b.hits.Load(), "a removed item is never sent")
}

// TestGroupCommitAddFirstGoesAhead: an item added with AddFirst while
// others wait is in the next pipeline, ahead of them.
func TestGroupCommitAddFirstGoesAhead(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var order []int
	g := newGC(1, 1, func(batch []*gcItem) {
		mu.Lock()
		for _, it := range batch {
			order = append(order, it.id)
		}
		mu.Unlock()
		answer(batch)
	})
	release := g.Hold()
	items := make([]*gcItem, 3)
	for i := range items {
		items[i] = &gcItem{id: i, done: make(chan struct{})}
	}
	require.True(t, g.Add(items[0]))
	require.True(t, g.Add(items[1]))
	require.True(t, g.AddFirst(items[2]))
	release()
	for _, it := range items {
		select {
		case <-it.done:
		case <-time.After(2 * time.Second):
			t.Fatal("an item was never answered")
		}
	}
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, []int{2, 0, 1}, order, "the urgent item first, the others in their order")
}
