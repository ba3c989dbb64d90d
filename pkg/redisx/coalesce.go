package redisx

import (
	"context"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"
)

// Coalescer sends the commands of concurrent callers in shared pipelines
// (group commit): a caller that finds a free flusher slot sends everything
// queued in one write and keeps flushing until its own commands are
// answered; callers arriving meanwhile queue for the next pipeline. Under
// light load a pipeline carries one caller's commands and adds no wait;
// under load one write and one read carry up to Max callers', which saves a
// system call pair per caller on both sides. Safe for concurrent use.
type Coalescer struct {
	Redis redis.UniversalClient
	// Max is the most callers per pipeline (default 64); Flushers the most
	// pipelines in flight at once (default 4); Timeout bounds one
	// pipeline's round trip (default 1 s).
	Max, Flushers int
	Timeout       time.Duration

	mu       sync.Mutex
	pending  []*coalesced
	flushing int
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
	it := &coalesced{add: add, done: make(chan struct{})}
	c.mu.Lock()
	c.pending = append(c.pending, it)
	flushers := c.Flushers
	if flushers <= 0 {
		flushers = 4
	}
	if c.flushing < flushers {
		c.flushing++
		c.flushUntil(it)
	} else {
		c.mu.Unlock()
	}
	select {
	case <-it.done:
		return nil
	case <-ctx.Done():
		return ctx.Err()
	}
}

// flushUntil is called with mu held and a flusher slot taken; it returns with
// mu released, once own is answered (own == nil: once nothing is pending).
func (c *Coalescer) flushUntil(own *coalesced) {
	most := c.Max
	if most <= 0 {
		most = 64
	}
	for len(c.pending) > 0 {
		n := min(len(c.pending), most)
		batch := c.pending[:n:n]
		if c.pending = c.pending[n:]; len(c.pending) == 0 {
			c.pending = nil
		}
		c.mu.Unlock()
		c.flush(batch)
		c.mu.Lock()
		if own != nil && closed(own.done) && len(c.pending) > 0 {
			go func() { // hand the rest over: this caller's commands are answered
				c.mu.Lock()
				c.flushUntil(nil)
			}()
			c.mu.Unlock()
			return
		}
	}
	c.flushing--
	c.mu.Unlock()
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
