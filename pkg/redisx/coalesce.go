package redisx

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Coalescer sends the commands of concurrent callers in shared pipelines,
// a GroupCommit of callers: one write and one read carry up to Max callers'
// commands. Safe for concurrent use; set the fields before the first Do.
type Coalescer struct {
	Redis redis.UniversalClient
	// Max is the most callers per pipeline (default 64); Flushers the most
	// pipelines in flight at once (default 4; GroupCommit says when more
	// than one goes out); Timeout bounds one pipeline's round trip
	// (default 1 s).
	Max, Flushers int
	Timeout       time.Duration

	once sync.Once
	gc   GroupCommit[*coalesced]
}

type coalesced struct {
	add  func(ctx context.Context, pipe redis.Pipeliner)
	done chan struct{}
}

// Do queues add, which puts a caller's commands on a pipeline, and returns
// once that pipeline was answered; each command then holds its own result
// or error. It returns ctx's error if ctx ends first (the commands may or may
// not have been sent).
func (c *Coalescer) Do(ctx context.Context, add func(ctx context.Context, pipe redis.Pipeliner)) error {
	c.once.Do(func() {
		c.gc = GroupCommit[*coalesced]{Max: c.Max, Flushers: c.Flushers, Flush: c.flush, Done: func(it *coalesced) bool { return closed(it.done) }}
	})
	it := &coalesced{add: add, done: make(chan struct{})}
	c.gc.Add(it) // no MaxQueue: never refused
	select {
	case <-it.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

func (c *Coalescer) flush(batch []*coalesced) {
	timeout := c.Timeout
	if timeout <= 0 {
		timeout = time.Second
	}
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	pipe := c.Redis.Pipeline()
	for _, it := range batch {
		it.add(ctx, pipe)
	}
	_, _ = pipe.Exec(ctx) // every command carries its own error
	for _, it := range batch {
		close(it.done)
	}
}

func closed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}
