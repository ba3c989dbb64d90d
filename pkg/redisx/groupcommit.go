package redisx

import (
	"runtime"
	"sync"
)

// GroupCommit is the queue and the flusher slots of a group commit, the
// shape of both of Floodgate's pipelined Redis writers (the limiter's check
// scripts and Envoy's counters). Concurrent callers queue items; a caller
// that takes a flusher slot sends everything queued, Max items a pipeline,
// until its own item is answered, then hands what is left to a goroutine;
// callers arriving meanwhile wait for the next pipeline. Under light load a
// pipeline carries one item and adds no wait; under load one write and one
// read carry many, which saves a system call pair per item on both sides.
//
// A caller that finds one of Flushers slots free takes it and sends at once:
// behind a slow link several pipelines are in flight together, so a check
// waits for at most one round trip before its own goes out. Tried and not
// kept (2026-11-28): a second pipeline only for a full pipeline's worth
// waiting. At +40 ms to Redis it left one pipeline in flight at a time —
// p50 85 ms against 56 ms, and 12,362 checks answered in the phase
// against 14,745 (`make chaos` redis-slow) — and at saturation its gain in
// CPU per call was within the run-to-run noise (docs/benchmarks.md).
// A caller that takes a slot while another pipeline is in flight yields
// the processor once (runtime.Gosched) before it sends: on a saturated core
// the callers behind it are runnable already and queue their items in that
// moment, so the pipeline carries them (issue 34: at the pinned peerbench's
// saturation, fewer pipelines, a write and a read system call each, per
// check); with nothing else runnable, the yield returns at once.
// Safe for concurrent use.
type GroupCommit[T comparable] struct {
	Max      int             // items a pipeline; default 64
	Flushers int             // pipelines in flight at once, at most; default 4
	MaxQueue int             // items waiting for a pipeline; beyond, Add refuses (0: no bound)
	Flush    func(batch []T) // sends batch and answers every item in it
	Done     func(T) bool    // whether an item was answered

	mu       sync.Mutex
	pending  []T
	flushing int
}

func (g *GroupCommit[T]) max() int {
	if g.Max > 0 {
		return g.Max
	}
	return 64
}

func (g *GroupCommit[T]) flushers() int {
	if g.Flushers > 0 {
		return g.Flushers
	}
	return 4
}

// Add queues it and returns false when the queue is full (MaxQueue). When it
// takes a flusher slot, Add sends pipelines until it is answered before it
// returns; otherwise it returns at once and a flusher will send it.
func (g *GroupCommit[T]) Add(it T) bool { return g.add(it, false) }

// AddFirst is Add for an item that must not wait for the others (a
// CRITICAL check): it is queued ahead of them, so the next pipeline carries
// it, and a caller that takes a flusher slot sends at once, without the
// yield that lets the callers behind it join its pipeline. On a saturated
// core that yield is a whole turn of the run queue.
func (g *GroupCommit[T]) AddFirst(it T) bool { return g.add(it, true) }

func (g *GroupCommit[T]) add(it T, first bool) bool {
	g.mu.Lock()
	if g.MaxQueue > 0 && len(g.pending) >= g.MaxQueue {
		g.mu.Unlock()
		return false
	}
	g.pending = append(g.pending, it)
	if first && len(g.pending) > 1 {
		copy(g.pending[1:], g.pending[:len(g.pending)-1])
		g.pending[0] = it
	}
	if g.flushing < g.flushers() {
		g.flushing++
		if g.flushing > 1 && !first {
			// Another pipeline is in flight, so the process is busy: let the
			// goroutines ready to run queue their items first, so that this
			// pipeline carries them too (on a saturated core the next
			// callers are runnable already; with none, Gosched returns at
			// once). The slot is this caller's meanwhile.
			g.mu.Unlock()
			runtime.Gosched()
			g.mu.Lock()
		}
		g.flushUntil(it, true)
		return true
	}
	g.mu.Unlock()
	return true
}

// Remove takes it out of the queue if no pipeline has taken it yet, and
// reports whether it did (a caller that gave up waiting).
func (g *GroupCommit[T]) Remove(it T) bool {
	g.mu.Lock()
	defer g.mu.Unlock()
	for i, p := range g.pending {
		if p == it {
			g.pending = append(g.pending[:i:i], g.pending[i+1:]...)
			return true
		}
	}
	return false
}

// Queued is the number of items waiting for a pipeline.
func (g *GroupCommit[T]) Queued() int {
	g.mu.Lock()
	defer g.mu.Unlock()
	return len(g.pending)
}

// Hold takes every flusher slot until release is called, as if that many
// pipelines were in flight: Add only queues meanwhile. For tests of what a
// full queue does; release sends what was queued.
func (g *GroupCommit[T]) Hold() (release func()) {
	g.mu.Lock()
	held := g.flushers() - g.flushing
	g.flushing += held
	g.mu.Unlock()
	return func() {
		g.mu.Lock()
		g.flushing -= held
		if len(g.pending) == 0 {
			g.mu.Unlock()
			return
		}
		g.flushing++
		g.mu.Unlock()
		go func() {
			g.mu.Lock()
			g.flushUntil(*new(T), false)
		}()
	}
}

// flushUntil is called with mu held and a flusher slot taken; it returns with
// mu released, once own is answered (hasOwn false: once nothing is pending).
func (g *GroupCommit[T]) flushUntil(own T, hasOwn bool) {
	for len(g.pending) > 0 {
		n := min(len(g.pending), g.max())
		batch := g.pending[:n:n]
		if g.pending = g.pending[n:]; len(g.pending) == 0 {
			g.pending = nil
		}
		g.mu.Unlock()
		g.Flush(batch)
		g.mu.Lock()
		if hasOwn && g.Done(own) && len(g.pending) > 0 {
			go func() { // hand the rest over: this caller's item is answered
				g.mu.Lock()
				g.flushUntil(*new(T), false)
			}()
			g.mu.Unlock()
			return
		}
	}
	g.flushing--
	g.mu.Unlock()
}
