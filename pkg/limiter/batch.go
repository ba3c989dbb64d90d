package limiter

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
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
	cmds  []*redis.Cmd
	done  chan struct{}
	// deadline is the caller's (zero: none): an item still queued when it
	// passes is answered ErrPastDeadline instead of being sent.
	deadline time.Time
	// room for a check's calls (two at most: the principal's and the
	// IP's), so that its slices take no allocations of their own
	callBuf [2]scriptCall
	outBuf  [2]any
	errBuf  [2]error
	cmdBuf  [2]*redis.Cmd
}

// newBatchItem is an item of n calls, their slices in its own room when
// it has enough.
func newBatchItem(n int, deadline time.Time) *batchItem {
	it := &batchItem{done: make(chan struct{}), deadline: deadline}
	if n <= len(it.callBuf) {
		it.calls, it.out, it.errs, it.cmds = it.callBuf[:n], it.outBuf[:n], it.errBuf[:n], it.cmdBuf[:n]
		return it
	}
	it.calls, it.out, it.errs, it.cmds = make([]scriptCall, n), make([]any, n), make([]error, n), make([]*redis.Cmd, n)
	return it
}

// scriptBatcher sends the script calls of concurrent checks in shared
// pipelines: a redisx.GroupCommit of checks (one write and one read carry up
// to max checks, on the limiter's side and on Redis's), with a bounded queue.
type scriptBatcher struct {
	rdb    redis.UniversalClient
	script *redis.Script
	budget time.Duration  // bound of one pipeline's round trip
	m      *engineMetrics // round trips; nil in tests of the batcher alone
	gc     redisx.GroupCommit[*batchItem]
}

// newScriptBatcher batches up to max checks a pipeline, at most four
// pipelines in flight, and sheds a check that finds maxQueue waiting (0: no
// bound).
func newScriptBatcher(rdb redis.UniversalClient, script *redis.Script, max, maxQueue int, budget time.Duration, m *engineMetrics) *scriptBatcher {
	b := &scriptBatcher{rdb: rdb, script: script, budget: budget, m: m}
	b.gc = redisx.GroupCommit[*batchItem]{Max: max, Flushers: 4, MaxQueue: maxQueue, Flush: b.flush, Done: isDone}
	return b
}

// errOverloaded is a check the limiter had no capacity for: the queue for
// pipelines was full, or the check waited past its bound before its pipeline
// was sent. It says nothing about Redis.
var errOverloaded = errors.New("limiter overloaded")

// run sends the item's calls in the next pipeline and returns one result and
// one error per call. It returns errOverloaded when the queue is full, or when ctx ends
// or wait (> 0) passes before the calls were sent; ctx's error
// (context.DeadlineExceeded for wait) when that happens while they are in
// flight. A caller whose Add sent its own pipeline is answered by then and
// starts no timer; the others (under load, most: one flusher a pipeline)
// start one, a single allocation where a context with a deadline took
// three. An urgent item (a CRITICAL check's) is queued ahead of the others
// and, when its caller sends, sent without waiting for them
// (redisx.GroupCommit.AddFirst).
func (b *scriptBatcher) run(ctx context.Context, it *batchItem, wait time.Duration, urgent bool) ([]any, []error, error) {
	add := b.gc.Add
	if urgent {
		add = b.gc.AddFirst
	}
	if !add(it) {
		return nil, nil, errOverloaded
	}
	select {
	case <-it.done:
		return it.out, it.errs, nil
	default:
	}
	var expired <-chan time.Time
	if wait > 0 {
		t := time.NewTimer(wait)
		defer t.Stop()
		expired = t.C
	}
	var err error
	select {
	case <-it.done:
		return it.out, it.errs, nil
	case <-ctx.Done():
		err = ctx.Err()
	case <-expired:
		err = context.DeadlineExceeded
	}
	if b.gc.Remove(it) { // never sent: it is overload, not Redis
		return nil, nil, errOverloaded
	}
	return nil, nil, err
}

// dropPastDeadline answers the items whose caller's deadline has passed with
// ErrPastDeadline — no Redis time is spent on them — and returns the rest.
func (b *scriptBatcher) dropPastDeadline(batch []*batchItem) []*batchItem {
	var now time.Time
	keep := batch[:0]
	for _, it := range batch {
		if !it.deadline.IsZero() {
			if now.IsZero() {
				now = time.Now()
			}
			if !now.Before(it.deadline) {
				for j := range it.errs {
					it.errs[j] = ErrPastDeadline
				}
				close(it.done)
				continue
			}
		}
		keep = append(keep, it)
	}
	return keep
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
	batch = b.dropPastDeadline(batch)
	if len(batch) == 0 {
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), b.budget)
	defer cancel()
	if b.m != nil {
		defer b.m.roundTrip(time.Now())
	}
	pipe := b.rdb.Pipeline()
	for _, it := range batch {
		for j, c := range it.calls {
			it.cmds[j] = b.script.EvalSha(ctx, pipe, c.keys, c.args...)
		}
	}
	_, _ = pipe.Exec(ctx) // errors are read per command below
	var retry redis.Pipeliner
	for _, it := range batch {
		for j, c := range it.calls {
			if err := it.cmds[j].Err(); err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
				if retry == nil {
					retry = b.rdb.Pipeline()
				}
				it.cmds[j] = b.script.Eval(ctx, retry, c.keys, c.args...)
			}
		}
	}
	if retry != nil {
		_, _ = retry.Exec(ctx)
	}
	for _, it := range batch {
		for j, c := range it.cmds {
			if err := c.Err(); err != nil {
				it.errs[j] = fmt.Errorf("run check script: %w", err)
				continue
			}
			it.out[j] = c.Val()
		}
		close(it.done)
	}
}
