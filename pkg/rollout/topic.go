package rollout

import (
	"context"
	"fmt"
	"log/slog"
	"strconv"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// maxFetchBytes bounds one fetch of the rules topic: a few full-size
// versions (a version's rules are at most events.MaxRulesYAMLLen characters).
const maxFetchBytes = 8 << 20

// Topic reads and appends to the rules topic. It reads the one partition
// from its start without a consumer group (every reader wants every record).
// Safe for concurrent use.
type Topic struct {
	Name     string
	client   *kafka.Client
	producer *stream.Producer
	log      *slog.Logger
}

// NewTopic returns a client of the rules topic name on brokers; sec may be nil.
func NewTopic(brokers []string, sec *stream.Security, name string, log *slog.Logger) *Topic {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Topic{Name: name, client: sec.Client(brokers, 10*time.Second), log: log,
		producer: stream.NewProducer(stream.ProducerConfig{Brokers: brokers, Security: sec, Topic: name,
			Balancer: &kafka.LeastBytes{}, BatchTimeout: time.Millisecond, Logger: log})}
}

// Close releases the producer.
func (t *Topic) Close() error { return t.producer.Close() }

// Read returns the state of the whole topic as of now: every record up to
// the high watermark the first fetch reports.
func (t *Topic) Read(ctx context.Context) (State, error) {
	var st State
	_, err := t.fetch(ctx, &st, true)
	return st, err
}

// Follow calls fn with a copy of the state after every fetch that added
// records (and once after the first fetch, caught up or not), until ctx is
// done. A failed fetch is logged and retried after a pause; Follow returns
// only when ctx is done.
func (t *Topic) Follow(ctx context.Context, st State, fn func(State)) error {
	first := true
	for ctx.Err() == nil {
		n, ok := t.poll(ctx, &st)
		if !ok {
			select {
			case <-ctx.Done():
			case <-time.After(time.Second):
			}
			continue
		}
		if n > 0 || first {
			fn(st.Clone())
			first = false
		}
	}
	return nil
}

// poll is one fetch for Follow; a failure is logged (unless ctx ended) and
// reported as !ok.
func (t *Topic) poll(ctx context.Context, st *State) (int, bool) {
	n, err := t.fetch(ctx, st, false)
	if err != nil && ctx.Err() == nil {
		t.log.Warn("read rules topic; retrying", "topic", t.Name, "err", err)
	}
	return n, err == nil
}

// fetch reads from st.Next(): with all, until the high watermark; otherwise
// one fetch (waiting up to half a second for records). It returns how many
// records it applied. Records that do not decode are logged and skipped.
func (t *Topic) fetch(ctx context.Context, st *State, all bool) (int, error) {
	applied := 0
	for {
		off := st.Next()
		res, err := t.client.Fetch(ctx, &kafka.FetchRequest{Topic: t.Name, Partition: 0, Offset: off,
			MinBytes: 1, MaxBytes: maxFetchBytes, MaxWait: 500 * time.Millisecond})
		if err == nil {
			err = res.Error
		}
		if err != nil {
			return applied, fmt.Errorf("fetch %s at %d: %w", t.Name, off, err)
		}
		progressed := false
		err = kafkascan.Records(res, off, func(rec *kafka.Record) (bool, error) {
			var value []byte
			if rec.Value != nil {
				var err error
				if value, err = kafka.ReadAll(rec.Value); err != nil {
					return false, fmt.Errorf("value at %d: %w", rec.Offset, err)
				}
			}
			if value == nil { // a tombstone: compaction deletes the version
				st.drop(rec.Offset)
			} else if v, err := events.DecodeRulesVersion(value); err != nil {
				t.log.Error("rules topic record does not decode; skipped", "topic", t.Name, "offset", rec.Offset, "err", err)
				st.skip(rec.Offset)
			} else {
				st.Apply(rec.Offset, v)
				applied++
			}
			progressed = true
			return true, nil
		})
		if err != nil {
			return applied, fmt.Errorf("read %s at %d: %w", t.Name, off, err)
		}
		if !all || st.Next() >= res.HighWatermark {
			return applied, nil
		}
		if !progressed && st.Next() < res.HighWatermark {
			// Compacted away: move to the next offset the log still holds.
			st.skip(st.Next())
		}
	}
}

func (s *State) skip(offset int64) { s.next = max(s.next, offset+1) }

// drop handles a tombstone: nothing in this design writes one, so it only
// moves the position.
func (s *State) drop(offset int64) { s.skip(offset) }

// Publish appends records, in order, in one produce call acknowledged by
// all in-sync replicas. Read the topic to see the state they make.
func (t *Topic) Publish(ctx context.Context, recs ...events.RulesVersion) error {
	msgs := make([]kafka.Message, 0, len(recs))
	for i := range recs {
		value, err := events.EncodeRulesVersion(&recs[i])
		if err != nil {
			return fmt.Errorf("encode rules version %d: %w", recs[i].Version, err)
		}
		msgs = append(msgs, kafka.Message{Key: []byte(strconv.FormatInt(recs[i].Version, 10)), Value: value,
			Headers: stream.CloudEventHeaders(events.CETypeRulesVersion, recs[i].ID, "floodgate/rollout", recs[i].TS)})
	}
	if err := t.producer.Publish(ctx, msgs...); err != nil {
		return fmt.Errorf("publish to %s: %w", t.Name, err)
	}
	return nil
}
