package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// AsyncProducer defaults.
const (
	DefaultAsyncBufferSize    = 65536
	DefaultAsyncBatchSize     = 1000
	DefaultAsyncBatchTimeout  = 5 * time.Millisecond
	DefaultAsyncWriteAttempts = 5
	DefaultAsyncDrainTimeout  = 5 * time.Second
)

// writerPartitionBatch caps kafka-go's per-partition batch under Run's batches
// (see NewAsyncProducer).
const writerPartitionBatch = 64

// ErrUndelivered is wrapped by AsyncProducer.Run's error when messages were
// still unsent at the drain deadline.
var ErrUndelivered = errors.New("messages not delivered")

// AsyncProducerConfig configures an AsyncProducer.
type AsyncProducerConfig struct {
	// Brokers are the bootstrap broker addresses (host:port). Required.
	Brokers []string
	// Security is the TLS and SASL of the connections; nil is plaintext.
	Security *Security
	// Topic is the default topic for messages whose Topic is empty.
	Topic string
	// Name labels the producer's metrics (producer="..."); default Topic,
	// or "async" when Topic is empty.
	Name string
	// Balancer picks a message's partition; default &kafka.Hash{} on the key.
	Balancer kafka.Balancer
	// BufferSize is how many messages TryPublish can queue; default 65536.
	BufferSize int
	// BatchSize is the most messages written at once; default 1000.
	BatchSize int
	// BatchTimeout is the longest a message waits for its batch to fill;
	// default 5ms.
	BatchTimeout time.Duration
	// WriteAttempts is how many times a batch is written (each write itself
	// retries inside kafka-go) before its messages count as failed; default 5.
	WriteAttempts int
	// InitialBackoff and MaxBackoff bound the jittered backoff between write
	// attempts; defaults 100ms and 5s.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// DrainTimeout bounds sending what is buffered once Run's ctx is done;
	// default 5s.
	DrainTimeout time.Duration
	// OnFailed, if set, receives the messages that could not be written
	// (after WriteAttempts, or at the drain deadline); this is the hook for an
	// on-disk journal to replay later. It is called from Run's goroutine, must
	// not block for long, and owns the slice. Messages reported at the drain
	// deadline may have been written after all (at-least-once).
	OnFailed func([]kafka.Message)

	// Logger and Registerer: nil discards logs and leaves metrics unregistered.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Validate checks the configuration; zero values that have defaults are valid.
func (c AsyncProducerConfig) Validate() error {
	v := configCheck{config: "AsyncProducerConfig"}
	v.brokers(c.Brokers)
	for _, f := range []struct {
		name string
		v    int64
	}{
		{"BufferSize", int64(c.BufferSize)}, {"BatchSize", int64(c.BatchSize)},
		{"WriteAttempts", int64(c.WriteAttempts)}, {"BatchTimeout", int64(c.BatchTimeout)},
		{"InitialBackoff", int64(c.InitialBackoff)}, {"MaxBackoff", int64(c.MaxBackoff)},
		{"DrainTimeout", int64(c.DrainTimeout)},
	} {
		if f.v < 0 {
			v.bad(f.name, "must not be negative, got %d", f.v)
		}
	}
	d := c.WithDefaults()
	if d.MaxBackoff < d.InitialBackoff {
		v.bad("MaxBackoff", "must be at least InitialBackoff (%v), got %v", d.InitialBackoff, d.MaxBackoff)
	}
	return v.err()
}

// WithDefaults returns c with its zero fields that have defaults set to them
// (Name, sizes, timings, a discarding Logger).
func (c AsyncProducerConfig) WithDefaults() AsyncProducerConfig {
	c.Name = cmp.Or(c.Name, c.Topic, "async")
	c.BufferSize = cmp.Or(c.BufferSize, DefaultAsyncBufferSize)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultAsyncBatchSize)
	c.BatchTimeout = cmp.Or(c.BatchTimeout, DefaultAsyncBatchTimeout)
	c.WriteAttempts = cmp.Or(c.WriteAttempts, DefaultAsyncWriteAttempts)
	c.InitialBackoff, c.MaxBackoff = BackoffDefaults(c.InitialBackoff, c.MaxBackoff)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultAsyncDrainTimeout)
	c.Logger = OrDiscard(c.Logger)
	return c
}

// AsyncProducer queues messages without ever blocking the caller and writes
// them in batches, reliably (acks=all), from Run. When the buffer is full,
// TryPublish drops the message and counts it. TryPublish is safe for
// concurrent use.
type AsyncProducer struct {
	cfg AsyncProducerConfig
	log *slog.Logger
	p   *Producer
	buf *Handoff[kafka.Message]

	sent, failed prometheus.Counter
	queued       prometheus.Gauge

	ran atomic.Bool
}

// NewAsyncProducer creates an AsyncProducer; messages are written once Run is
// running. Call cfg.Validate first: NewAsyncProducer does not fail.
func NewAsyncProducer(cfg AsyncProducerConfig) *AsyncProducer {
	cfg = cfg.WithDefaults()
	metrics := producerMetrics(cfg.Registerer, cfg.Logger)
	log := cfg.Logger.With("producer", cfg.Name)
	p := newProducer(ProducerConfig{
		Brokers:  cfg.Brokers,
		Security: cfg.Security,
		Topic:    cfg.Topic,
		Balancer: cfg.Balancer,
		// Run already forms the batches; kafka-go splits one per partition
		// and sends a partition's batch when full or after its own timeout,
		// so keep that timeout short. kafka-go allocates every partition
		// batch at its full BatchSize capacity (make([]Message, 0, BatchSize)
		// in writeBatch.add), so a write of Run's batch to many partitions
		// with BatchSize 1000 allocated ~160 KB per partition touched: 85 KB
		// per decision at 2k/s, 90 % of the limiter's allocations. A small
		// per-partition cap keeps Run's batching and drops that garbage.
		BatchSize:    min(cfg.BatchSize, writerPartitionBatch),
		BatchTimeout: time.Millisecond,
		MaxAttempts:  3,
		Logger:       log,
	}.withDefaults(), metrics)
	return &AsyncProducer{
		cfg: cfg,
		log: log,
		p:   p,
		buf: NewHandoff[kafka.Message](cfg.BufferSize,
			metrics.asyncDropped.WithLabelValues(cfg.Name, dropFull), metrics.asyncDropped.WithLabelValues(cfg.Name, dropClosed)),
		sent:   metrics.asyncSent.WithLabelValues(cfg.Name),
		failed: metrics.asyncFailed.WithLabelValues(cfg.Name),
		queued: metrics.asyncQueued.WithLabelValues(cfg.Name),
	}
}

// TryPublish queues msg and returns true, or returns false at once — counting
// floodgate_stream_async_dropped_total — when the buffer is full or Run has
// stopped. It never blocks. A message without a Topic goes to the producer's
// default topic. The caller must not modify msg's slices afterwards.
func (a *AsyncProducer) TryPublish(msg kafka.Message) bool {
	return a.buf.Offer(msg)
}

// Run writes queued messages until ctx is done, then stops accepting
// messages, writes what is buffered until DrainTimeout, and closes the
// writer. It returns nil when everything accepted was written or reported
// failed (and passed to OnFailed) during normal operation, and an error
// wrapping ErrUndelivered, with the count, when messages were still unsent at
// the drain deadline (those are also passed to OnFailed). Run may be called
// once.
func (a *AsyncProducer) Run(ctx context.Context) error {
	if !a.ran.CompareAndSwap(false, true) {
		return errors.New("stream: AsyncProducer.Run called twice")
	}
	// Writes outlive ctx by DrainTimeout, so the drain can still send.
	wctx, cancelWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWrites()
	var drainDeadline atomic.Pointer[time.Time]
	stopAfter := context.AfterFunc(ctx, func() {
		deadline := time.Now().Add(a.cfg.DrainTimeout)
		drainDeadline.Store(&deadline)
		time.AfterFunc(a.cfg.DrainTimeout, cancelWrites)
	})
	defer stopAfter()

	batch := make([]kafka.Message, 0, a.cfg.BatchSize)
	timer := time.NewTimer(a.cfg.BatchTimeout)
	timer.Stop()
	defer timer.Stop()
	for ctx.Err() == nil {
		select {
		case <-ctx.Done():
		case msg := <-a.buf.C():
			batch = append(batch[:0], msg)
			batch = a.fill(ctx, batch, timer)
			a.write(wctx, batch)
			a.queued.Set(float64(a.buf.Len()))
		}
	}

	// Drain: refuse new messages, then send what is left.
	a.buf.Close()
	buffered := a.buf.Len()
	a.log.Info("async producer draining", "buffered", buffered)
	var undelivered int
	for {
		batch = a.take(batch[:0])
		if len(batch) == 0 {
			break
		}
		if wctx.Err() != nil {
			undelivered += len(batch)
			a.fail(batch, wctx.Err(), "drain deadline passed")
			continue
		}
		undelivered += a.write(wctx, batch)
	}
	a.queued.Set(0)

	closed := make(chan error, 1)
	go func() { closed <- a.p.Close() }()
	closeWait := time.Second
	if p := drainDeadline.Load(); p != nil {
		closeWait = max(closeWait, time.Until(*p))
	}
	select {
	case err := <-closed:
		if err != nil {
			a.log.Warn("close writer", "err", err)
		}
	case <-time.After(closeWait):
		a.log.Warn("writer still flushing after drain; not waiting for it")
	}
	if undelivered > 0 {
		a.log.Error("async producer stopped with undelivered messages", "undelivered", undelivered, "buffered_at_drain", buffered)
		return fmt.Errorf("async producer %s: %w: %d at the drain deadline", a.cfg.Name, ErrUndelivered, undelivered)
	}
	a.log.Info("async producer stopped", "buffered_at_drain", buffered)
	return nil
}

// fill adds queued messages to batch until it is full, BatchTimeout has passed
// since its first message, or ctx is done.
func (a *AsyncProducer) fill(ctx context.Context, batch []kafka.Message, timer *time.Timer) []kafka.Message {
	armed := false
	defer func() {
		if armed {
			timer.Stop()
		}
	}()
	for {
		if batch = a.take(batch); len(batch) >= a.cfg.BatchSize {
			return batch
		}
		if !armed {
			timer.Reset(a.cfg.BatchTimeout)
			armed = true
		}
		select {
		case msg := <-a.buf.C():
			batch = append(batch, msg)
		case <-timer.C:
			armed = false
			return batch
		case <-ctx.Done():
			return batch
		}
	}
}

// take adds to batch, without waiting, what the buffer holds, up to BatchSize.
func (a *AsyncProducer) take(batch []kafka.Message) []kafka.Message {
	return TakeBuffered(a.buf.C(), batch, a.cfg.BatchSize)
}

// TakeBuffered appends to batch, without waiting, what ch holds, until batch
// has n elements or ch is empty. The AsyncProducer's and the journal's
// writers fill their batches with it.
func TakeBuffered[T any](ch <-chan T, batch []T, n int) []T {
	for len(batch) < n {
		select {
		case v := <-ch:
			batch = append(batch, v)
		default:
			return batch
		}
	}
	return batch
}

// write writes batch, retrying what failed up to WriteAttempts times, and
// returns how many messages it gave up on (reported through fail).
func (a *AsyncProducer) write(ctx context.Context, batch []kafka.Message) int {
	var rejected int
	if a.cfg.Topic != "" {
		_ = a.p.fillTopic(batch) // cannot fail with a default topic
	} else {
		batch, rejected = a.dropTopicless(batch)
		if len(batch) == 0 {
			return rejected
		}
	}
	return rejected + a.send(ctx, batch)
}

// send writes batch, whose messages all name a topic; see write.
func (a *AsyncProducer) send(ctx context.Context, batch []kafka.Message) int {
	pending := batch
	var bo *backoff.ExponentialBackOff
	var err error
	for attempt := 1; ; attempt++ {
		err = a.p.write(ctx, pending)
		if err == nil {
			a.sent.Add(float64(len(pending)))
			return 0
		}
		var tooLarge kafka.MessageTooLargeError
		if errors.As(err, &tooLarge) {
			// kafka-go sends nothing when one message is too large: drop it
			// and retry the rest at once.
			a.fail([]kafka.Message{tooLarge.Message}, err, "message too large")
			pending = tooLarge.Remaining
			attempt--
			if len(pending) == 0 {
				return 1
			}
			continue
		}
		var werrs kafka.WriteErrors
		if errors.As(err, &werrs) && len(werrs) == len(pending) {
			var failed []kafka.Message
			for i, e := range werrs {
				if e != nil {
					failed = append(failed, pending[i])
				}
			}
			a.sent.Add(float64(len(pending) - len(failed)))
			pending = failed
		}
		if attempt >= a.cfg.WriteAttempts || ctx.Err() != nil {
			break
		}
		if bo == nil {
			bo = newBackoff(a.cfg.InitialBackoff, a.cfg.MaxBackoff)
		}
		wait := min(bo.NextBackOff(), a.cfg.MaxBackoff)
		a.log.Warn("async write failed; retrying", "messages", len(pending), "attempt", attempt, "backoff", wait, "err", err)
		if !tick.Sleep(ctx, wait) {
			break
		}
	}
	a.fail(pending, err, "write attempts exhausted")
	return len(pending)
}

// dropTopicless removes, in place, the messages that name no topic (the
// producer has no default) and reports them failed.
func (a *AsyncProducer) dropTopicless(batch []kafka.Message) ([]kafka.Message, int) {
	var bad []kafka.Message
	kept := batch[:0]
	for _, m := range batch {
		if m.Topic == "" {
			bad = append(bad, m)
		} else {
			kept = append(kept, m)
		}
	}
	a.fail(bad, ErrNoTopic, "message has no topic")
	return kept, len(bad)
}

// fail counts msgs as failed, logs them, and hands a copy to OnFailed.
func (a *AsyncProducer) fail(msgs []kafka.Message, err error, why string) {
	if len(msgs) == 0 {
		return
	}
	a.failed.Add(float64(len(msgs)))
	if a.cfg.OnFailed == nil {
		a.log.Error("async messages not delivered", "messages", len(msgs), "reason", why, "err", err)
		return
	}
	// Handed on, not lost: a journal keeps them and logs at ERROR only what
	// it could not keep.
	a.log.Warn("async messages not delivered to Kafka; handed on to be kept", "messages", len(msgs), "reason", why, "err", err)
	cp := make([]kafka.Message, len(msgs))
	copy(cp, msgs)
	a.cfg.OnFailed(cp)
}
