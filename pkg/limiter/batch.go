package limiter

import (
	"context"
	"errors"
	"fmt"
	"sync"
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
}

// scriptBatcher sends the script calls of concurrent checks in shared pipelines
// (group commit): a check that finds a free flusher slot sends everything queued
// in one write, and keeps flushing until its own calls are answered; checks
// arriving meanwhile queue for the next pipeline. Under light load a pipeline
// carries one check (no added wait); under heavy load one write and one read
// carry up to max checks, on the limiter's side and on Redis's. A flusher that
// leaves work behind hands it to a goroutine, so nothing queued is left waiting.
type scriptBatcher struct {
	rdb         redis.UniversalClient
	script      *redis.Script
	max         int            // checks per pipeline
	maxFlushers int            // pipelines in flight at once
	budget      time.Duration  // bound of one pipeline's round trip
	maxQueue    int            // checks waiting for a pipeline; beyond, shed at once (0: no bound)
	m           *engineMetrics // round trips; nil in tests of the batcher alone

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
	if b.flushers < b.maxFlushers {
		b.flushers++
		b.flushUntil(it)
	} else {
		b.mu.Unlock()
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
		b.flush(batch)
		b.mu.Lock()
		if own != nil && isDone(own) && len(b.pending) > 0 {
			go func() { // hand the rest over: the flusher's own check is answered
				b.mu.Lock()
				b.flushUntil(nil)
			}()
			b.mu.Unlock()
			return
		}
	}
	b.flushers--
	b.mu.Unlock()
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
// calls a node answered NOSCRIPT) and answers each item.
func (b *scriptBatcher) flush(batch []*batchItem) {
	ctx, cancel := context.WithTimeout(context.Background(), b.budget)
	defer cancel()
	if b.m != nil {
		defer b.m.roundTrip(time.Now())
	}
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
		it.out = make([]any, len(it.calls))
		it.errs = make([]error, len(it.calls))
		for j, c := range cmds[i] {
			if err := c.Err(); err != nil {
				it.errs[j] = fmt.Errorf("run check script: %w", err)
				continue
			}
			it.out[j] = c.Val()
		}
		close(it.done)
	}
}
