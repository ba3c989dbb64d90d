package journal

import (
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
// Order per key is kept within each path but not across them: a message
// journaled during an outage arrives after newer ones sent live once Kafka
// is back (decision events carry their own ts).
type DurableProducer struct {
	async   *stream.AsyncProducer
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
		return d, nil
	}
	a := cfg.Async
	a.OnFailed = j.OnFailed
	d.async = stream.NewAsyncProducer(a)
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

// Run runs the producer and the journal until ctx is done. Then the async
// producer drains (what it cannot send goes to the journal), the journal
// writes what was offered to it and closes. Run returns an error wrapping
// stream.ErrUndelivered only if messages were lost, not when they were journaled.
// Run may be called once.
func (d *DurableProducer) Run(ctx context.Context) error {
	if d.journal == nil {
		return d.async.Run(ctx)
	}
	jctx, stopJournal := context.WithCancel(context.WithoutCancel(ctx))
	defer stopJournal()
	jdone := make(chan error, 1)
	go func() { jdone <- d.journal.Run(jctx, d.replay) }()

	lostBefore := d.journal.lost.Load()
	aerr := d.async.Run(ctx)
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
