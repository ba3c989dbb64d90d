package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"
)

// Batch defaults.
const (
	DefaultBatchMaxMessages = 10_000
	DefaultBatchMaxBytes    = 16 << 20
	DefaultBatchLinger      = time.Second
)

// BatchHandler handles one batch: consecutive messages of one partition, in
// offset order, that passed the door. Their offsets are committed only after
// it returns nil (and the messages it rejected are dead-lettered), so a sink
// that makes the batch durable before returning — a flush to a database —
// never has an offset committed past data it has not stored. ctx is
// cancelled only at the drain or rebalance deadline. One partition's batches
// are handled one at a time, in order; different partitions' batches run
// concurrently. A handler must not modify the messages' Key, Value or
// Headers in place, nor keep b after it returns.
//
// Return nil when the batch is done; an error wrapped with Permanent (or
// implementing Permanent() bool) to dead-letter every message of the batch;
// any other error to have the whole batch handled again with backoff, up to
// MaxAttempts (then every message is dead-lettered as transient_exhausted). A
// handler that must never lose a batch (a ledger) retries its own writes and
// sets MaxAttempts high. To refuse single messages (undecodable, or outside
// the event-time window) and keep the rest, call b.Reject and return nil.
type BatchHandler func(ctx context.Context, b *Batch) error

// Batch is what a BatchHandler gets.
type Batch struct {
	Topic     string
	Partition int
	Messages  []kafka.Message
	Attempt   int // 1-based; above 1 the same messages were handled before and failed

	rejected []rejection
}

// Reject marks Messages[i] as failing permanently with err: when the handler
// returns nil it is dead-lettered (class event_time for an *EventTimeError,
// poison otherwise) before the batch's offsets are committed. Not safe for
// concurrent use.
func (b *Batch) Reject(i int, err error) {
	if err == nil {
		err = errors.New("rejected by the batch handler")
	}
	b.rejected = append(b.rejected, rejection{index: i, err: err})
}

// BatchConfig bounds a batch: it is handed to the handler when it holds
// MaxMessages messages or MaxBytes bytes (key + value + headers), or Linger
// after its first message was fetched, whichever comes first.
type BatchConfig struct {
	MaxMessages int           // default 10,000
	MaxBytes    int           // default 16 MiB
	Linger      time.Duration // default 1s
}

// Validate checks the configuration; errors wrap ErrInvalidConfig and name
// the field. Zero values take the defaults.
func (c BatchConfig) Validate() error {
	v := configCheck{config: "BatchConfig"}
	if c.MaxMessages < 0 {
		v.bad("MaxMessages", "must be at least 1 (0 means %d), got %d", DefaultBatchMaxMessages, c.MaxMessages)
	}
	if c.MaxBytes < 0 {
		v.bad("MaxBytes", "must be at least 1 (0 means %d), got %d", DefaultBatchMaxBytes, c.MaxBytes)
	}
	if c.Linger < 0 || (c.Linger > 0 && c.Linger < time.Millisecond) || c.Linger > time.Hour {
		v.bad("Linger", "must be in 1ms..1h (0 means %v), got %v", DefaultBatchLinger, c.Linger)
	}
	return v.err()
}

func (c BatchConfig) withDefaults() BatchConfig {
	c.MaxMessages = cmp.Or(c.MaxMessages, DefaultBatchMaxMessages)
	c.MaxBytes = cmp.Or(c.MaxBytes, DefaultBatchMaxBytes)
	c.Linger = cmp.Or(c.Linger, DefaultBatchLinger)
	return c
}

type batchMode struct {
	cfg     BatchConfig
	handler BatchHandler
}

// NewBatchConsumer validates cfg and bc and returns a Consumer that hands h
// one partition's messages a batch at a time, committing a batch's offsets
// right after h returned nil for it (CommitInterval still commits what the
// door settled between batches). Everything else — the door, retries, dead
// letters, metrics, the middleware, rebalances — is the per-message
// Consumer's.
//
// Rebalance and shutdown: when a partition is revoked (or ctx is done), the
// batch being gathered is handed to h at once, as it stands, and h gets until
// min(DrainTimeout, RebalanceTimeout/2) (DrainTimeout on shutdown) to finish;
// its offsets are committed before the consumer rejoins. A batch whose
// handler is still running at that deadline has its context cancelled and is
// not committed: the partition's next owner gets those messages again, so
// the sink must be idempotent (the quota ledger fences by offset).
func NewBatchConsumer(cfg ConsumerConfig, bc BatchConfig, h BatchHandler) (*Consumer, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: NewBatchConsumer: handler is nil", ErrInvalidConfig)
	}
	if err := errors.Join(cfg.Validate(), bc.Validate()); err != nil {
		return nil, err
	}
	c, err := newConsumer(cfg)
	if err != nil {
		return nil, err
	}
	c.batch = &batchMode{cfg: bc.withDefaults(), handler: h}
	c.call = c.compose(c.batchCall)
	return c, nil
}

// batchCall adapts a BatchHandler to the shared middleware.
func (c *Consumer) batchCall(ctx context.Context, inv *Invocation) error {
	msgs := inv.Messages
	b := &Batch{Topic: inv.Topic, Partition: inv.Partition, Messages: msgs, Attempt: inv.Attempt}
	inv.rejected = nil
	err := c.batch.handler(ctx, b)
	for _, rj := range b.rejected {
		if rj.index < 0 || rj.index >= len(msgs) {
			return fmt.Errorf("batch handler rejected message %d of %d", rj.index, len(msgs))
		}
	}
	inv.rejected = b.rejected
	return err
}

// consumeBatches is batch mode: messages that pass the door are gathered and
// handed to the handler by count, bytes or linger; after the handler returned
// nil the batch's offsets are committed at once.
func (p *partitionRun) consumeBatches() {
	c := p.g.c
	bc := c.batch.cfg
	var (
		msgs     []kafka.Message
		size     int
		deadline time.Time
	)
	flush := func() bool {
		if len(msgs) == 0 {
			return true
		}
		c.batchMessages.Observe(float64(len(msgs)))
		if !c.handleUnit(p.hctx, msgs) {
			c.abandonCount.Inc()
			return false
		}
		for _, m := range msgs {
			p.ps.track.finish(m.Offset)
		}
		if err := p.g.commit(); err != nil {
			c.log.Warn("commit after batch; retrying next interval", "partition", p.ps.id, "err", err)
		}
		msgs, size, deadline = nil, 0, time.Time{}
		return true
	}
	for {
		msg, expired, ok := p.fetch(deadline)
		if !ok {
			// Fetching ended (revoke or shutdown): the batch gathered so far
			// is handled now, within the drain budget.
			flush()
			return
		}
		if expired {
			if !flush() {
				return
			}
			continue
		}
		if len(msgs) == 0 {
			deadline = time.Now().Add(bc.Linger)
		}
		msgs = append(msgs, msg)
		size += messageBytes(msg)
		if len(msgs) >= bc.MaxMessages || size >= bc.MaxBytes || !time.Now().Before(deadline) {
			if !flush() {
				return
			}
		}
	}
}
