package stream

import (
	"context"
	"errors"
	"fmt"
	"hash/crc32"
	"log/slog"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/protocol"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// RecordBatcher forms Kafka record batches where events are born: TryAppend
// encodes a message straight into the open record batch (Kafka's v2 wire
// format, uncompressed) of the partition its key hashes to, under that
// partition's lock, and copies everything it keeps, so the caller reuses its
// buffers and nothing is allocated per message. One goroutine per partition
// seals its batch when full (BatchSize records or batchBytes) or
// BatchTimeout after its first record, and writes it whole with
// kafka-go's RawProduce (acks=all), retrying as the AsyncProducer does;
// a batch given up on is decoded back into messages for OnFailed (the
// journal). The partition is kafka.Hash's (FNV-1a of the key, as sarama),
// so a key lands where the AsyncProducer and the journal's replay put it.
//
// It counts what it does in the AsyncProducer's metrics under the same
// producer name — floodgate_stream_async_sent_total, _failed_total,
// _dropped_total — and its records held in floodgate_stream_async_queued
// with producer="<name>:batched". TryPublish refuses (false, counted) when
// BufferSize records are held, before Run has read the topic's partitions,
// and after Run has stopped: a caller such as journal.DurableProducer then
// takes another path. Safe for concurrent use.
type RecordBatcher struct {
	cfg    AsyncProducerConfig
	log    *slog.Logger
	client *kafka.Client
	parts  atomic.Pointer[[]*recordPartition] // nil until Run has the partitions
	held   atomic.Int64                       // records appended and not yet sent or failed
	// free holds emptied batches for reuse: a list rather than a
	// sync.Pool, so their buffers (up to batchBytes each) outlive GCs.
	free chan *recordBatch

	droppedFull, droppedClosed, sent, failed prometheus.Counter
	queued                                   prometheus.Gauge

	ran atomic.Bool
}

// batchBytes seals a record batch once it holds this much: well under the
// broker's default message.max.bytes (1 MiB).
const batchBytes = 256 << 10

// recordBatchHeader is the size of a record set's size (int32) and of a v2
// record batch's header, from baseOffset to recordCount.
const recordBatchHeader = 4 + 61

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

type recordPartition struct {
	mu     sync.Mutex
	id     int
	cur    *recordBatch   // open: TryAppend appends here
	sealed []*recordBatch // full, waiting for the partition's writer
	closed bool
	wake   chan struct{} // cap 1: a first record, or a sealed batch
	_      [64]byte      // keep partitions' locks on their own cache lines
}

// recordBatch is one v2 record batch being built: a header left blank until
// seal, then the records.
type recordBatch struct {
	buf        []byte
	n          int32
	first, max int64 // timestamps, ms
	rd         bytesReader
}

// NewRecordBatcher creates a RecordBatcher for cfg.Topic (required: it is
// the only topic it writes); it takes records once Run has read the topic's
// partitions. cfg.Balancer is ignored (see RecordBatcher). Call
// cfg.Validate first.
func NewRecordBatcher(cfg AsyncProducerConfig) *RecordBatcher {
	cfg = cfg.WithDefaults()
	metrics, err := NewMetrics(cfg.Registerer)
	if err != nil {
		cfg.Logger.Error("stream metrics left unregistered", "err", err)
		metrics, _ = NewMetrics(nil)
	}
	transport := cfg.Security.Transport()
	r := &RecordBatcher{
		cfg:           cfg,
		log:           cfg.Logger.With("producer", cfg.Name, "batched", true),
		client:        &kafka.Client{Addr: kafka.TCP(cfg.Brokers...), Transport: transport, Timeout: 10 * time.Second},
		droppedFull:   metrics.asyncDropped.WithLabelValues(cfg.Name, dropFull),
		droppedClosed: metrics.asyncDropped.WithLabelValues(cfg.Name, dropClosed),
		sent:          metrics.asyncSent.WithLabelValues(cfg.Name),
		failed:        metrics.asyncFailed.WithLabelValues(cfg.Name),
		queued:        metrics.asyncQueued.WithLabelValues(cfg.Name + ":batched"),
		free:          make(chan *recordBatch, 64),
	}
	return r
}

// Ready reports whether Run has read the topic's partitions, so TryAppend
// takes records.
func (r *RecordBatcher) Ready() bool { return r.parts.Load() != nil }

// TryAppend encodes msg (Key, Value, Headers, Time; a zero Time is now) into
// its partition's open batch and returns true, or returns false at once
// when it cannot take it (see RecordBatcher); a refusal for a full buffer or
// a stopped batcher is counted. It copies what it keeps: the caller may
// reuse msg's slices once it returns. It never blocks on I/O.
func (r *RecordBatcher) TryAppend(msg kafka.Message) bool {
	ps := r.parts.Load()
	if ps == nil {
		return false
	}
	if r.held.Load() >= int64(r.cfg.BufferSize) {
		r.droppedFull.Inc()
		return false
	}
	parts := *ps
	p := parts[partitionOf(msg.Key, len(parts))]
	t := msg.Time
	if t.IsZero() {
		t = time.Now()
	}
	ts := t.UnixMilli()
	p.mu.Lock()
	if p.closed {
		p.mu.Unlock()
		r.droppedClosed.Inc()
		return false
	}
	b := p.cur
	first := b == nil
	if first {
		b = r.newBatch()
		p.cur = b
	}
	b.append(ts, msg.Key, msg.Value, msg.Headers)
	full := int(b.n) >= r.cfg.BatchSize || len(b.buf) >= batchBytes
	if full {
		p.sealed = append(p.sealed, b)
		p.cur = nil
	}
	p.mu.Unlock()
	r.held.Add(1)
	if first || full {
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	return true
}

// partitionOf is kafka.Hash's choice among n partitions: FNV-1a of the key,
// as an int32, modulo n, made positive (sarama's hashPartitioner). A nil key
// goes to partition 0.
func partitionOf(key []byte, n int) int {
	if key == nil {
		return 0
	}
	h := uint32(2166136261)
	for _, c := range key {
		h ^= uint32(c)
		h *= 16777619
	}
	p := int32(h) % int32(n)
	if p < 0 {
		p = -p
	}
	return int(p)
}

// Run reads the topic's partitions (retrying until ctx is done), then writes
// sealed batches until ctx is done; then it refuses new records, writes what
// it holds until DrainTimeout and returns, with an error wrapping
// ErrUndelivered when records were still unsent at the deadline (those are
// also passed to OnFailed). Run may be called once.
func (r *RecordBatcher) Run(ctx context.Context) error {
	if !r.ran.CompareAndSwap(false, true) {
		return errors.New("stream: RecordBatcher.Run called twice")
	}
	n, err := r.partitions(ctx)
	if err != nil {
		return nil // stopped before the topic was read: nothing was taken
	}
	parts := make([]*recordPartition, n)
	for i := range parts {
		parts[i] = &recordPartition{id: i, wake: make(chan struct{}, 1)}
	}
	r.parts.Store(&parts)

	wctx, cancelWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWrites()
	stopAfter := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.DrainTimeout, cancelWrites) })
	defer stopAfter()

	var undelivered atomic.Int64
	var wg sync.WaitGroup
	for _, p := range parts {
		wg.Go(func() { undelivered.Add(int64(r.runPartition(ctx, wctx, p))) })
	}
	<-ctx.Done()
	for _, p := range parts {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
		select {
		case p.wake <- struct{}{}:
		default:
		}
	}
	wg.Wait()
	r.queued.Set(0)
	if u := undelivered.Load(); u > 0 {
		r.log.Error("record batcher stopped with undelivered messages", "undelivered", u)
		return fmt.Errorf("record batcher %s: %w: %d at the drain deadline", r.cfg.Name, ErrUndelivered, u)
	}
	return nil
}

// partitions reads how many partitions the topic has.
func (r *RecordBatcher) partitions(ctx context.Context) (int, error) {
	bo := newBackoff(r.cfg.InitialBackoff, r.cfg.MaxBackoff)
	for {
		resp, err := r.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{r.cfg.Topic}})
		if err == nil {
			for _, t := range resp.Topics {
				if t.Name == r.cfg.Topic && t.Error == nil && len(t.Partitions) > 0 {
					return len(t.Partitions), nil
				}
				if t.Name == r.cfg.Topic && t.Error != nil {
					err = t.Error
				}
			}
			if err == nil {
				err = fmt.Errorf("topic %s has no partitions", r.cfg.Topic)
			}
		}
		wait := min(bo.NextBackOff(), r.cfg.MaxBackoff)
		r.log.Warn("read topic partitions; messages take the unbatched path until then", "topic", r.cfg.Topic, "backoff", wait, "err", err)
		if !tick.Sleep(ctx, wait) {
			return 0, ctx.Err()
		}
	}
}

// runPartition writes p's batches: a sealed one at once, the open one
// BatchTimeout after it was opened, everything once p is closed. It returns
// how many records it gave up on after ctx was done.
func (r *RecordBatcher) runPartition(ctx, wctx context.Context, p *recordPartition) int {
	timer := time.NewTimer(r.cfg.BatchTimeout)
	timer.Stop()
	defer timer.Stop()
	armed, expired := false, false
	var undelivered int
	for {
		p.mu.Lock()
		var b *recordBatch
		tookOpen := false
		if len(p.sealed) > 0 {
			b = p.sealed[0]
			copy(p.sealed, p.sealed[1:])
			p.sealed[len(p.sealed)-1] = nil
			p.sealed = p.sealed[:len(p.sealed)-1]
		} else if p.cur != nil && (p.closed || expired) {
			b, p.cur, tookOpen = p.cur, nil, true
		}
		open, closed := p.cur != nil, p.closed
		p.mu.Unlock()
		if b != nil {
			if tookOpen {
				expired = false
			}
			if u := r.send(wctx, p.id, b); ctx.Err() != nil {
				undelivered += u
			}
			continue
		}
		if closed {
			return undelivered
		}
		if open && !armed {
			timer.Reset(r.cfg.BatchTimeout)
			armed = true
		}
		select {
		case <-p.wake:
		case <-timer.C:
			armed, expired = false, true
		}
	}
}

// send writes b to partition, retrying up to WriteAttempts times, recycles
// it, and returns how many records it gave up on (passed to OnFailed).
func (r *RecordBatcher) send(ctx context.Context, partition int, b *recordBatch) int {
	b.seal()
	n := int(b.n)
	var err error
	var bo interface{ NextBackOff() time.Duration }
	for attempt := 1; ; attempt++ {
		b.rd.reset(b.buf)
		var resp *kafka.ProduceResponse
		resp, err = r.client.RawProduce(ctx, &kafka.RawProduceRequest{Topic: r.cfg.Topic, Partition: partition,
			RequiredAcks: kafka.RequireAll, RawRecords: protocol.RawRecordSet{Reader: &b.rd}})
		if err == nil && resp.Error != nil {
			err = resp.Error
		}
		if err == nil {
			r.sent.Add(float64(n))
			r.done(b, n)
			return 0
		}
		if attempt >= r.cfg.WriteAttempts || ctx.Err() != nil {
			break
		}
		if bo == nil {
			bo = newBackoff(r.cfg.InitialBackoff, r.cfg.MaxBackoff)
		}
		wait := min(bo.NextBackOff(), r.cfg.MaxBackoff)
		r.log.Warn("batched write failed; retrying", "partition", partition, "messages", n, "attempt", attempt, "backoff", wait, "err", err)
		if !tick.Sleep(ctx, wait) {
			break
		}
	}
	r.failed.Add(float64(n))
	msgs, derr := b.messages(r.cfg.Topic, partition)
	switch {
	case derr != nil: // a bug in append or decode, never input
		r.log.Error("batched messages not delivered and not decodable", "messages", n, "err", errors.Join(err, derr))
	case r.cfg.OnFailed == nil:
		r.log.Error("batched messages not delivered", "messages", n, "err", err)
	default:
		r.log.Warn("batched messages not delivered to Kafka; handed on to be kept", "messages", n, "err", err)
		r.cfg.OnFailed(msgs)
	}
	r.done(b, n)
	return n
}

// newBatch returns an empty batch, a recycled one when there is one.
func (r *RecordBatcher) newBatch() *recordBatch {
	select {
	case b := <-r.free:
		return b
	default:
		return &recordBatch{buf: make([]byte, recordBatchHeader, batchBytes+8<<10)}
	}
}

// done forgets b's n records and recycles it.
func (r *RecordBatcher) done(b *recordBatch, n int) {
	r.queued.Set(float64(r.held.Add(-int64(n))))
	b.reset()
	select {
	case r.free <- b:
	default:
	}
}
