package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/twmb/franz-go/pkg/kgo"
)

// Why the partition reader is franz-go's and not kafka-go's. kafka-go's Reader
// decompresses a compressed record batch whole into one bytes.Buffer with no
// bound (message_reader.go, readMessageV2: decompressed.ReadFrom(codecReader));
// ReaderConfig.MaxBytes bounds only the compressed bytes of a fetch, and the
// codec comes from a process-wide table. A 1 MB gzip bomb therefore becomes
// gigabytes of heap before the consumer sees a message. franz-go's client
// stops decompressing a batch at MaxDecompressBatchBytes, reports
// ErrDecompressTooLarge with the offset after the batch, and stops fetching
// the partition until it is moved past it. The consumer group protocol
// (join, sync, heartbeats, commits) stays kafka-go's ConsumerGroup.

// errBatchTooLarge is what FetchMessage returns for a record batch that
// decompresses to more than the limit. The partition fetches nothing more
// until SetOffset moves it (to next, past the batch).
type errBatchTooLarge struct {
	first, next int64 // the batch's first offset, and the offset after its last
	limit       int
}

func (e *errBatchTooLarge) Error() string {
	return fmt.Sprintf("record batch at offsets %d..%d decompresses to more than %d bytes", e.first, e.next-1, e.limit)
}

// kgoPartitionReader reads one partition with a franz-go client that
// consumes only that partition, without a group. It is not safe for
// concurrent use; one goroutine owns it.
type kgoPartitionReader struct {
	brokers  []string
	sec      *Security
	topic    string
	part     int32
	maxWait  time.Duration
	maxBytes int // decompressed batch bound
	log      *slog.Logger
	opts     []kgo.Opt // more client options, after the reader's own (tests: hooks)

	cl      *kgo.Client
	pending []kafka.Message
	tooBig  *errBatchTooLarge // reported once by franz-go; returned after pending
}

var _ partitionReader = (*kgoPartitionReader)(nil)

func newKgoPartitionReader(brokers []string, sec *Security, topic string, partition int, maxWait time.Duration, maxDecompressed int, log *slog.Logger) *kgoPartitionReader {
	return &kgoPartitionReader{brokers: brokers, sec: sec, topic: topic, part: int32(partition), maxWait: maxWait, maxBytes: maxDecompressed, log: log}
}

func kgoOffset(offset int64) kgo.Offset {
	switch offset {
	case kafka.FirstOffset:
		return kgo.NewOffset().AtStart()
	case kafka.LastOffset:
		return kgo.NewOffset().AtEnd()
	}
	return kgo.NewOffset().At(offset)
}

// SetOffset positions the reader: the first call creates the client, later
// calls move it (dropping what was fetched and not returned).
func (r *kgoPartitionReader) SetOffset(offset int64) error {
	r.pending, r.tooBig = nil, nil
	if r.cl != nil {
		// No epoch known: -1 skips truncation detection for the jump.
		r.cl.SetOffsets(map[string]map[int32]kgo.EpochOffset{r.topic: {r.part: {Epoch: -1, Offset: offset}}})
		return nil
	}
	opts := append([]kgo.Opt{
		kgo.SeedBrokers(r.brokers...),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{r.topic: {r.part: kgoOffset(offset)}}),
		kgo.FetchMaxWait(r.maxWait),
		kgo.FetchMaxPartitionBytes(1 << 20),
		kgo.FetchMaxBytes(int32(max(4<<20, 2*r.maxBytes))),
		kgo.MaxDecompressBatchBytes(r.maxBytes),
		kgo.WithLogger(kgoLogger{log: r.log}),
	}, r.sec.kgoOpts()...)
	opts = append(opts, r.opts...)
	cl, err := kgo.NewClient(opts...)
	if err != nil {
		return fmt.Errorf("partition reader %s/%d: %w", r.topic, r.part, err)
	}
	r.cl = cl
	return nil
}

// FetchMessage returns the next message, waiting until one arrives or ctx
// ends. A batch over the decompression bound comes back as
// *errBatchTooLarge.
//
// Records a poll took are kept, and come first, even when ctx ended
// meanwhile: the client's position is already past them. ctx can end after
// the client handed them over and before the poll returns (a batch's linger
// deadline landing then, or the goroutine descheduled there on a loaded
// machine); dropped there, they were skipped for good — the partition went
// on after them and the batch consumer committed past messages no handler
// had seen (units missing from the quota ledger).
func (r *kgoPartitionReader) FetchMessage(ctx context.Context) (kafka.Message, error) {
	if r.cl == nil {
		return kafka.Message{}, errors.New("partition reader: SetOffset was not called")
	}
	for len(r.pending) == 0 {
		if r.tooBig != nil {
			// The client fetches nothing more until SetOffset; until then
			// every call reports the batch.
			return kafka.Message{}, r.tooBig
		}
		fs := r.cl.PollFetches(ctx)
		var ferr error
		fs.EachPartition(func(p kgo.FetchTopicPartition) {
			if p.Err != nil {
				var tooLarge *kgo.ErrDecompressTooLarge
				if errors.As(p.Err, &tooLarge) {
					r.tooBig = &errBatchTooLarge{first: tooLarge.Offset, next: tooLarge.NextOffset, limit: r.maxBytes}
				} else if ferr == nil {
					ferr = p.Err
				}
			}
			for _, rec := range p.Records {
				r.pending = append(r.pending, toMessage(rec, p.HighWatermark))
			}
		})
		if len(r.pending) > 0 {
			break // messages before a refused batch come first
		}
		// ctx only now, after the poll's records (or refused batch) are kept.
		if err := ctx.Err(); err != nil {
			return kafka.Message{}, err
		}
		if ferr != nil {
			return kafka.Message{}, ferr
		}
		if fs.IsClientClosed() {
			return kafka.Message{}, errors.New("partition reader closed")
		}
	}
	m := r.pending[0]
	r.pending = r.pending[1:]
	return m, nil
}

func toMessage(rec *kgo.Record, hwm int64) kafka.Message {
	var hs []kafka.Header
	if len(rec.Headers) > 0 {
		hs = make([]kafka.Header, len(rec.Headers))
		for i, h := range rec.Headers {
			hs[i] = kafka.Header{Key: h.Key, Value: h.Value}
		}
	}
	return kafka.Message{
		Topic: rec.Topic, Partition: int(rec.Partition), Offset: rec.Offset, HighWaterMark: hwm,
		Key: rec.Key, Value: rec.Value, Headers: hs, Time: rec.Timestamp,
	}
}

// Close closes the client.
func (r *kgoPartitionReader) Close() error {
	if r.cl != nil {
		r.cl.Close()
	}
	return nil
}

// kgoLogger passes franz-go's warnings and errors to slog.
type kgoLogger struct{ log *slog.Logger }

func (l kgoLogger) Level() kgo.LogLevel { return kgo.LogLevelWarn }

func (l kgoLogger) Log(level kgo.LogLevel, msg string, keyvals ...any) {
	lv := slog.LevelWarn
	if level == kgo.LogLevelError {
		lv = slog.LevelError
	}
	l.log.Log(context.Background(), lv, "kafka partition reader: "+msg, keyvals...)
}
