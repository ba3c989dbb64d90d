package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// scriptCall is one check-script call: its keys and arguments.
type scriptCall struct {
	keys []string
	args []any
}

// batchItem is one check's calls (one per hash tag) waiting for a pipeline.
type batchItem struct {
	calls []scriptCall
	out   []any
	errs  []error // per call
	done  chan struct{}
	once  sync.Once // answered once: by Redis's reply or by the budget
}

// answer gives it its results unless it already has them.
func (it *batchItem) answer(out []any, errs []error) {
	it.once.Do(func() {
		it.out, it.errs = out, errs
		close(it.done)
	})
}

// errPastBudget answers the calls of a pipeline Redis did not answer within
// the budget. The pipeline itself goes on waiting (up to linger) so that its
// connection stays in step and in the pool.
var errPastBudget = fmt.Errorf("no reply within the budget: %w", context.DeadlineExceeded)

// scriptBatcher sends the script calls of concurrent checks in shared pipelines
// (group commit): a check that finds a free flusher slot sends everything queued
// in one write, and keeps flushing until its own calls are answered; checks
// arriving meanwhile queue for the next pipeline. Under light load a pipeline
// carries one check (no added wait); under heavy load one write and one read
// carry up to max checks, on the limiter's side and on Redis's. A flusher that
// leaves work behind hands it to a goroutine, so nothing queued is left waiting.
//
// Every check is answered by its budget. While Redis answers within half the
// budget, the check that takes a flusher slot flushes in its own goroutine
// (the cheapest path: no hand-off) and its pipeline ends at the budget; once a
// round trip has taken longer, flushers run in goroutines of their own and a
// pipeline may linger past the budget for a late reply (see flush), while its
// checks are answered at the budget.
type scriptBatcher struct {
	rdb         redis.UniversalClient
	script      *redis.Script
	max         int            // checks per pipeline
	maxFlushers int            // pipelines in flight at once
	budget      time.Duration  // how long a check waits for its pipeline's reply
	linger      time.Duration  // how long the pipeline waits for it (≥ budget): the socket deadline
	maxQueue    int            // checks waiting for a pipeline; beyond, shed at once (0: no bound)
	m           *engineMetrics // round trips; nil in tests of the batcher alone
	slow        atomic.Bool    // the last round trip took more than half the budget

	mu       sync.Mutex
	pending  []*batchItem
	flushers int
}

// errOverloaded is a check the limiter had no capacity for: the queue for
// pipelines was full, or the check waited past its bound before its pipeline
// was sent. It says nothing about Redis.
var errOverloaded = errors.New("limiter overloaded")

// run sends calls in the next pipeline and returns one result and one error
// per call. It returns errOverloaded when the queue is full, or when ctx ends
// before the calls were sent; ctx's error when ctx ends while they are in flight.
func (b *scriptBatcher) run(ctx context.Context, calls []scriptCall) ([]any, []error, error) {
	it := &batchItem{calls: calls, done: make(chan struct{})}
	b.mu.Lock()
	if b.maxQueue > 0 && len(b.pending) >= b.maxQueue {
		b.mu.Unlock()
		return nil, nil, errOverloaded
	}
	b.pending = append(b.pending, it)
	switch {
	case b.flushers == b.maxFlushers:
		b.mu.Unlock()
	case b.slow.Load():
		b.flushers++
		b.mu.Unlock()
		go b.handOver()
	default:
		b.flushers++
		b.flushUntil(it)
	}
	select {
	case <-it.done:
		return it.out, it.errs, nil
	case <-ctx.Done():
		b.mu.Lock()
		for i, p := range b.pending {
			if p == it { // never sent: take it out, and it is overload, not Redis
				b.pending = append(b.pending[:i:i], b.pending[i+1:]...)
				b.mu.Unlock()
				return nil, nil, errOverloaded
			}
		}
		b.mu.Unlock()
		return nil, nil, ctx.Err()
	}
}

// flushUntil is called with mu held and a flusher slot taken; it returns with
// mu released, once own is answered (own == nil: once nothing is pending).
func (b *scriptBatcher) flushUntil(own *batchItem) {
	for len(b.pending) > 0 {
		n := min(len(b.pending), b.max)
		batch := b.pending[:n:n]
		if b.pending = b.pending[n:]; len(b.pending) == 0 {
			b.pending = nil
		}
		b.mu.Unlock()
		b.flush(batch, own == nil) // a check's own goroutine waits for its budget only
		b.mu.Lock()
		if own != nil && isDone(own) && len(b.pending) > 0 {
			b.mu.Unlock()
			go b.handOver() // the flusher's own check is answered: the rest is another goroutine's
			return
		}
	}
	b.flushers--
	b.mu.Unlock()
}

// handOver flushes, in a goroutine of its own, with the slot its caller took.
func (b *scriptBatcher) handOver() {
	b.mu.Lock()
	b.flushUntil(nil)
}

func isDone(it *batchItem) bool {
	select {
	case <-it.done:
		return true
	default:
		return false
	}
}

// flush sends every call of batch in one pipeline (EVALSHA, then EVAL for the
// calls a node answered NOSCRIPT) and answers each item: with Redis's reply,
// or with errPastBudget once the budget has passed. A reply later than the
// budget but within linger is read and dropped, so the connection goes back to
// the pool: timing out the socket at the budget closed it, and behind a slow
// link the next pipeline paid a dial and a handshake inside its own budget,
// timed out in turn, and so on (chaos redis-slow at +40 ms). Only a flusher
// in a goroutine of its own lingers; a check flushing in its own goroutine
// (Redis fast) bounds the pipeline by its budget, as the socket did before.
func (b *scriptBatcher) flush(batch []*batchItem, linger bool) {
	wait := b.budget
	if linger {
		wait = max(b.linger, b.budget)
	}
	ctx, cancel := context.WithTimeout(context.Background(), wait)
	defer cancel()
	start := time.Now()
	late := time.AfterFunc(b.budget, func() {
		b.slow.Store(true)
		for _, it := range batch {
			errs := make([]error, len(it.calls))
			for j := range errs {
				errs[j] = fmt.Errorf("run check script: %w", errPastBudget)
			}
			it.answer(nil, errs)
		}
	})
	defer late.Stop()
	if b.m != nil {
		defer b.m.roundTrip(start)
	}
	defer func() { b.slow.Store(time.Since(start) > b.budget/2) }()
	cmds := make([][]*redis.Cmd, len(batch))
	pipe := b.rdb.Pipeline()
	for i, it := range batch {
		cmds[i] = make([]*redis.Cmd, len(it.calls))
		for j, c := range it.calls {
			cmds[i][j] = b.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	var retry redis.Pipeliner
	for i, it := range batch {
		for j, c := range it.calls {
			if err := cmds[i][j].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				if retry == nil {
					retry = b.rdb.Pipeline()
				}
				cmds[i][j] = b.script.Eval(ctx, retry, c.keys, c.args...)
			}
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	for i, it := range batch {
		out, errs := make([]any, len(it.calls)), make([]error, len(it.calls))
		for j, c := range cmds[i] {
			if err := c.Err(); err != nil {
				errs[j] = fmt.Errorf("run check script: %w", err)
				continue
			}
			out[j] = c.Val()
		}
		it.answer(out, errs)
	}
}
