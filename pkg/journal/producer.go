package journal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/google/uuid"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// DurableProducerConfig configures a DurableProducer: a stream.AsyncProducer
// backed by an on-disk Journal.
type DurableProducerConfig struct {
	// Async configures the in-memory producer. Its OnFailed must be nil when
	// the journal is enabled: the journal takes that hook.
	Async stream.AsyncProducerConfig
	// Journal configures the journal; an empty Dir disables it (the
	// DurableProducer is then a plain stream.AsyncProducer). Logger and Registerer
	// default to Async's, Name to Async's name.
	Journal Config
}

// Validate checks both configurations and how they fit together.
func (c DurableProducerConfig) Validate() error {
	errs := []error{c.Async.Validate()}
	if c.Journal.Dir != "" {
		errs = append(errs, c.Journal.Validate())
		if c.Async.OnFailed != nil {
			errs = append(errs, fmt.Errorf("%w: AsyncProducerConfig.OnFailed: must be nil when the journal is enabled (the journal takes the hook)", stream.ErrInvalidConfig))
		}
	}
	return errors.Join(errs...)
}

// DurableProducer publishes without ever blocking the caller and keeps what
// Kafka does not take on disk, replaying it when Kafka is back:
//
//   - TryPublish queues the message in the stream.AsyncProducer's buffer; when that
//     is full (Kafka slow or down), it offers the message to the journal's
//     bounded hand-off queue instead. Both are non-blocking channel sends.
//     Only when both are full does TryPublish return false (counted).
//   - Batches the stream.AsyncProducer gives up on (retries exhausted, drain
//     deadline) are appended to the journal (OnFailed).
//   - The journal's drainer re-publishes journaled messages with acks=all,
//     oldest first, and deletes a segment only once all of it was
//     acknowledged.
//
// Delivery is at-least-once: a write that timed out may have succeeded and
// then be replayed. Every message carries its event id in the ce_id header
// (TryPublish adds a random one when missing) so consumers deduplicate.
// Order per key. TryAppend's messages of a key reach their partition in
// TryAppend's order while Kafka takes them: across the record batcher's
// start (it holds them in arrival order until it knows the partitions) and
// across retries (a failed batch is retried at its partition's head, one
// request in flight per partition). The journal replays oldest first. Order
// is not kept across a spill to the journal, which happens only while
// Kafka is slow or down:
//
//   - a message the batcher refuses (BufferSize held) is offered to the
//     journal, and a later one of its key taken once the batcher has room
//     again is sent live, ahead of the journaled one's replay;
//   - a batch given up on after WriteAttempts is journaled (OnFailed) while
//     its partition's later batches are sent live, and it is written to the
//     journal after messages offered to it earlier;
//   - what the drain could not send at shutdown is replayed at the next
//     start beside that process's live messages.
//
// Decision events carry their own ts. TryPublish's path (the async
// producer, then the journal) keeps a key's order within itself likewise;
// the two publish calls take different paths, so a topic's messages should
// use one of them.
type DurableProducer struct {
	async *stream.AsyncProducer
	// batch forms record batches where events are born (TryAppend); nil
	// when the configuration has no default topic or another balancer.
	batch   *stream.RecordBatcher
	journal *Journal // nil when disabled
	// journalErr is why a configured journal could not be opened (the
	// producer then runs without it).
	journalErr error
	replay     *stream.Producer // nil when disabled
	topic      string
	log        *slog.Logger
}

// NewDurableProducer validates cfg, opens (and recovers) the journal, and
// creates the producers; messages are written once Run is running.
func NewDurableProducer(cfg DurableProducerConfig) (*DurableProducer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	acfg := cfg.Async.WithDefaults()
	d := &DurableProducer{topic: cfg.Async.Topic, log: acfg.Logger.With("producer", acfg.Name)}
	if cfg.Journal.Dir == "" {
		d.async = stream.NewAsyncProducer(cfg.Async)
		d.batch = newBatcher(cfg.Async)
		return d, nil
	}
	jcfg := cfg.Journal
	if jcfg.Name == "" {
		jcfg.Name = acfg.Name
	}
	if jcfg.Logger == nil {
		jcfg.Logger = cfg.Async.Logger
	}
	if jcfg.Registerer == nil {
		jcfg.Registerer = cfg.Async.Registerer
	}
	j, err := Open(jcfg)
	if errors.Is(err, stream.ErrInvalidConfig) || errors.Is(err, ErrLocked) {
		// A wrong configuration, or a directory another limiter journals
		// to (two would interleave their segments), must be fixed first.
		return nil, fmt.Errorf("open journal: %w", err)
	}
	if err != nil {
		// A missing, read-only or unwritable directory (or one another
		// process holds) is no reason to refuse to serve: events are kept
		// in the producer's memory buffer only, and what does not fit is
		// dropped and counted, as without a journal.
		d.log.Warn("JOURNAL UNAVAILABLE: decision events are kept in memory only while Kafka is unreachable; fix FLOODGATE_JOURNAL_DIR",
			"dir", jcfg.Dir, "err", err)
		d.journalErr = err
		d.async = stream.NewAsyncProducer(cfg.Async)
		d.batch = newBatcher(cfg.Async)
		return d, nil
	}
	a := cfg.Async
	a.OnFailed = j.OnFailed
	d.async = stream.NewAsyncProducer(a)
	d.batch = newBatcher(a)
	d.journal = j
	d.replay = stream.NewProducer(stream.ProducerConfig{
		Brokers:      cfg.Async.Brokers,
		Security:     cfg.Async.Security,
		Topic:        cfg.Async.Topic,
		Balancer:     cfg.Async.Balancer,
		BatchSize:    j.cfg.ReplayBatchSize,
		BatchTimeout: time.Millisecond,
		MaxAttempts:  3,
		Logger:       acfg.Logger.With("producer", acfg.Name+"-replay"),
		Registerer:   cfg.Async.Registerer,
	})
	return d, nil
}

// Journal returns the journal, or nil when it is disabled.
func (d *DurableProducer) Journal() *Journal { return d.journal }

// TryPublish queues msg and returns true, or returns false at once when both
// the in-memory buffer and the journal's hand-off queue are full (or Run has
// stopped); refusals are counted in floodgate_stream_async_dropped_total
// (which also counts, as reason="full", messages that then went to the
// journal: floodgate_stream_journaled_total{source="overflow"}) and
// floodgate_stream_journal_dropped_total{reason="queue_full"}. It never
// blocks. A message without a ce_id header gets a random one (msg.Headers is
// copied, not modified). The caller must not modify msg's slices afterwards.
func (d *DurableProducer) TryPublish(msg kafka.Message) bool {
	if msg.Topic == "" {
		msg.Topic = d.topic
	}
	msg.Headers = withEventID(msg.Headers)
	if d.async.TryPublish(msg) {
		return true
	}
	return d.journal != nil && d.journal.Offer(msg)
}

// newBatcher is the RecordBatcher for a, or nil when a has no default
// topic (the batcher writes one) or a balancer other than kafka.Hash (the
// batcher hashes keys as kafka.Hash does).
func newBatcher(a stream.AsyncProducerConfig) *stream.RecordBatcher {
	if a.Topic == "" {
		return nil
	}
	if _, hash := a.Balancer.(*kafka.Hash); a.Balancer != nil && !hash {
		return nil
	}
	return stream.NewRecordBatcher(a)
}

// TryAppend is TryPublish for a caller that reuses its buffers: it copies
// what it keeps, so msg's slices are the caller's again once it returns.
// A message for the default topic is encoded at once into its partition's
// record batch (stream.RecordBatcher: no allocation, batches formed here;
// until the batcher has read the topic's partitions it keeps copies in
// arrival order, never handing any to the async producer, so a key's
// messages are not reordered by the switch); when the batcher holds its
// BufferSize or has stopped, a copy is offered to the journal. A message
// for another topic takes TryPublish's paths. It never blocks.
//
// Use one of TryAppend and TryPublish for a topic's messages: the two take
// different paths (the record batcher, the async producer) and a key's
// messages are ordered within a path only.
func (d *DurableProducer) TryAppend(msg kafka.Message) bool {
	if msg.Topic == "" {
		msg.Topic = d.topic
	}
	msg.Headers = withEventID(msg.Headers)
	if d.batch != nil && msg.Topic == d.topic {
		if d.batch.TryAppend(msg) {
			return true
		}
		return d.journal != nil && d.journal.Offer(cloneMessage(msg))
	}
	return d.TryPublish(cloneMessage(msg))
}

// cloneMessage copies msg's key, value and headers.
func cloneMessage(msg kafka.Message) kafka.Message {
	msg.Key = bytes.Clone(msg.Key)
	msg.Value = bytes.Clone(msg.Value)
	hs := make([]kafka.Header, len(msg.Headers))
	for i, h := range msg.Headers {
		hs[i] = kafka.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
	}
	msg.Headers = hs
	return msg
}

// Run runs the producer and the journal until ctx is done. Then the async
// producer and the record batcher drain (what they cannot send goes to the
// journal), the journal writes what was offered to it and closes. Run
// returns an error wrapping stream.ErrUndelivered only if messages were
// lost, not when they were journaled. Run may be called once.
func (d *DurableProducer) Run(ctx context.Context) error {
	if d.journal == nil {
		return errors.Join(d.runProducers(ctx)...)
	}
	jctx, stopJournal := context.WithCancel(context.WithoutCancel(ctx))
	defer stopJournal()
	jdone := make(chan error, 1)
	go func() { jdone <- d.journal.Run(jctx, d.replay) }()

	lostBefore := d.journal.lost.Load()
	aerr := errors.Join(d.runProducers(ctx)...)
	if errors.Is(aerr, stream.ErrUndelivered) && d.journal.lost.Load() == lostBefore {
		d.log.Info("messages undelivered at shutdown are in the journal and will be replayed", "err", aerr)
		aerr = nil
	}
	stopJournal()
	jerr := <-jdone

	closed := make(chan error, 1)
	go func() { closed <- d.replay.Close() }()
	select {
	case err := <-closed:
		if err != nil {
			d.log.Warn("close replay writer", "err", err)
		}
	case <-time.After(time.Second):
		d.log.Warn("replay writer still flushing; not waiting for it")
	}
	return errors.Join(aerr, jerr)
}

// runProducers runs the async producer and the record batcher until ctx is
// done and both have drained, and returns their errors.
func (d *DurableProducer) runProducers(ctx context.Context) []error {
	if d.batch == nil {
		return []error{d.async.Run(ctx)}
	}
	berr := make(chan error, 1)
	go func() { berr <- d.batch.Run(ctx) }()
	aerr := d.async.Run(ctx)
	return []error{aerr, <-berr}
}

// withEventID returns hs with a ce_id header, adding a random UUID in a copy
// when hs has none (or an empty one).
func withEventID(hs []kafka.Header) []kafka.Header {
	for _, h := range hs {
		if h.Key == stream.HeaderCEID && len(h.Value) > 0 {
			return hs
		}
	}
	out := make([]kafka.Header, 0, len(hs)+1)
	for _, h := range hs {
		if h.Key != stream.HeaderCEID {
			out = append(out, h)
		}
	}
	return append(out, kafka.Header{Key: stream.HeaderCEID, Value: []byte(uuid.NewString())})
}

// JournalError reports why a configured journal is not in use (nil when it
// is, or when none was configured).
func (d *DurableProducer) JournalError() error { return d.journalErr }
