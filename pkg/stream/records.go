package stream

import (
	"bytes"
	"cmp"
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
	"github.com/segmentio/kafka-go/protocol/produce"
	"github.com/segmentio/kafka-go/protocol/rawproduce"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// RecordBatcher forms Kafka record batches where events are born: TryAppend
// encodes a message straight into the open record batch (Kafka's v2 wire
// format, uncompressed) of the partition its key hashes to, under that
// partition's lock, and copies everything it keeps, so the caller reuses its
// buffers and nothing is allocated per message. A batch is sealed at
// BatchSize records or batchBytes. Run's flusher, BatchTimeout after the
// first record held (sooner when a batch is full), takes one batch of every
// partition and writes them in one produce request per leader broker
// (kafka-go's rawproduce, acks=all: the batch is the request's record set,
// never encoded again), retrying what failed as the AsyncProducer does; a
// batch given up on is decoded back into messages for OnFailed (the
// journal). The partition is kafka.Hash's (FNV-1a of the key, as sarama),
// so a key lands where the AsyncProducer and the journal's replay put it.
//
// It counts what it does in the AsyncProducer's metrics under the same
// producer name — floodgate_stream_async_sent_total, _failed_total,
// _dropped_total — and the records it holds in floodgate_stream_async_queued
// with producer="<name>:batched". TryAppend refuses (false, counted) when
// BufferSize records are held or after Run has stopped: a caller such as
// journal.DurableProducer then takes another path.
//
// Order per key: a key's records are written in TryAppend's order, from the
// first record on. Until Run has read the topic's partitions (a broker
// unreachable at start-up) TryAppend keeps copies in one list in arrival
// order; Run moves them into their partitions' batches, oldest first, before
// it lets any later record in, so none overtakes an earlier one (taking the
// AsyncProducer's path meanwhile did: issue 34). A partition has one
// request in flight and a failed batch is retried at its partition's head.
// Safe for concurrent use.
type RecordBatcher struct {
	cfg    AsyncProducerConfig
	log    *slog.Logger
	client *kafka.Client
	parts  atomic.Pointer[[]*recordPartition] // nil until Run has the partitions
	// Before parts is set: records held in arrival order (copies), and
	// whether Run has stopped without reading the partitions. Run sets
	// parts under preMu once it has moved pre into the partitions.
	preMu     sync.Mutex
	pre       []kafka.Message
	preClosed bool
	held      atomic.Int64  // records appended and not yet sent or failed
	sealed    atomic.Int64  // full batches waiting
	wake      chan struct{} // cap 1: a first record, or a full batch
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
	_      [64]byte // keep partitions' locks on their own cache lines
}

// recordBatch is one v2 record batch being built: a header left blank until
// seal, then the records.
type recordBatch struct {
	partition  int // set when taken for a write
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
	metrics := producerMetrics(cfg.Registerer, cfg.Logger)
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
		wake:          make(chan struct{}, 1),
	}
	return r
}

// Ready reports whether Run has read the topic's partitions, so TryAppend
// encodes records straight into their partitions' batches (before, it
// keeps copies in arrival order).
func (r *RecordBatcher) Ready() bool { return r.parts.Load() != nil }

// TryAppend encodes msg (Key, Value, Headers, Time; a zero Time is now) into
// its partition's open batch and returns true, or returns false at once
// when it cannot take it (see RecordBatcher); a refusal for a full buffer or
// a stopped batcher is counted. It copies what it keeps: the caller may
// reuse msg's slices once it returns. It never blocks on I/O.
func (r *RecordBatcher) TryAppend(msg kafka.Message) bool {
	ps := r.parts.Load()
	if ps == nil {
		if ok, held := r.tryHold(msg); held {
			return ok
		}
		ps = r.parts.Load() // Run set it meanwhile
	}
	if r.held.Load() >= int64(r.cfg.BufferSize) {
		r.droppedFull.Inc()
		return false
	}
	return r.appendTo(*ps, msg)
}

// tryHold keeps a copy of msg in r.pre while Run has not read the
// partitions; held is false when it has (the caller appends to them).
func (r *RecordBatcher) tryHold(msg kafka.Message) (ok, held bool) {
	r.preMu.Lock()
	defer r.preMu.Unlock()
	switch {
	case r.parts.Load() != nil:
		return false, false
	case r.preClosed:
		r.droppedClosed.Inc()
		return false, true
	case r.held.Load() >= int64(r.cfg.BufferSize):
		r.droppedFull.Inc()
		return false, true
	}
	m := kafka.Message{Key: bytes.Clone(msg.Key), Value: bytes.Clone(msg.Value), Time: msg.Time, Headers: make([]kafka.Header, len(msg.Headers))}
	for i, h := range msg.Headers {
		m.Headers[i] = kafka.Header{Key: h.Key, Value: bytes.Clone(h.Value)}
	}
	if m.Time.IsZero() {
		m.Time = time.Now()
	}
	r.pre = append(r.pre, m)
	if r.held.Add(1) == 1 {
		r.queued.Set(1)
	}
	return true, true
}

// appendTo encodes msg into its partition's open batch; false when the
// batcher has stopped.
func (r *RecordBatcher) appendTo(parts []*recordPartition, msg kafka.Message) bool {
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
		r.sealed.Add(1)
	}
	p.mu.Unlock()
	if held := r.held.Add(1); held == 1 || full {
		// The gauge leaves 0 with the first record held (peerbench and
		// the drain checks wait for it to read 0); done sets it after
		// every write.
		r.queued.Set(float64(held))
		select {
		case r.wake <- struct{}{}:
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

// Run reads the topic's partitions and their leaders (retrying until ctx is
// done), then flushes until ctx is done; then it refuses new records,
// flushes what it holds until DrainTimeout and returns, with an error
// wrapping ErrUndelivered when records were still unsent at the deadline
// (those are also passed to OnFailed). Run may be called once.
func (r *RecordBatcher) Run(ctx context.Context) error {
	if !r.ran.CompareAndSwap(false, true) {
		return errors.New("stream: RecordBatcher.Run called twice")
	}
	leaders, err := r.leaders(ctx)
	if err != nil {
		return r.failHeld(err) // stopped before the topic was read
	}
	parts := make([]*recordPartition, len(leaders))
	for i := range parts {
		parts[i] = &recordPartition{id: i}
	}
	// The records held so far go first, in arrival order; TryAppend waits
	// on preMu meanwhile and then appends behind them.
	r.preMu.Lock()
	for i := range r.pre {
		r.held.Add(-1) // appendTo counts it again
		r.appendTo(parts, r.pre[i])
	}
	r.pre = nil
	r.parts.Store(&parts)
	r.preMu.Unlock()
	f := &flusher{r: r, parts: parts, leader: leaders}

	wctx, cancelWrites := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWrites()
	stopAfter := context.AfterFunc(ctx, func() { time.AfterFunc(r.cfg.DrainTimeout, cancelWrites) })
	defer stopAfter()

	timer := time.NewTimer(r.cfg.BatchTimeout)
	timer.Stop()
	defer timer.Stop()
	for ctx.Err() == nil {
		if r.held.Load() == 0 {
			select { // wait for a first record
			case <-r.wake:
			case <-ctx.Done():
				continue
			}
		}
		// Linger: BatchTimeout, or until a batch is full.
		timer.Reset(r.cfg.BatchTimeout)
		for lingering := true; lingering && r.sealed.Load() == 0; {
			select {
			case <-r.wake:
			case <-timer.C:
				lingering = false
			case <-ctx.Done():
				lingering = false
			}
		}
		timer.Stop()
		f.flush(wctx)
	}

	// Drain: refuse new records, then send what is held.
	for _, p := range parts {
		p.mu.Lock()
		p.closed = true
		p.mu.Unlock()
	}
	for r.held.Load() > 0 && wctx.Err() == nil {
		f.flush(wctx)
	}
	undelivered := f.failAll(wctx.Err())
	r.queued.Set(0)
	if undelivered > 0 {
		r.log.Error("record batcher stopped with undelivered messages", "undelivered", undelivered)
		return fmt.Errorf("record batcher %s: %w: %d at the drain deadline", r.cfg.Name, ErrUndelivered, undelivered)
	}
	return nil
}

// failHeld gives up on the records held before the partitions were read
// (Run stopped first): they are counted as failed and handed to OnFailed,
// and later ones are refused.
func (r *RecordBatcher) failHeld(cause error) error {
	r.preMu.Lock()
	held := r.pre
	r.pre, r.preClosed = nil, true
	r.preMu.Unlock()
	r.held.Add(-int64(len(held)))
	r.queued.Set(0)
	if len(held) == 0 {
		return nil
	}
	for i := range held {
		held[i].Topic = r.cfg.Topic
	}
	r.failed.Add(float64(len(held)))
	if r.cfg.OnFailed == nil {
		r.log.Error("record batcher stopped before it read the topic's partitions; messages not delivered", "messages", len(held), "err", cause)
	} else {
		r.log.Warn("record batcher stopped before it read the topic's partitions; messages handed on to be kept", "messages", len(held), "err", cause)
		r.cfg.OnFailed(held)
	}
	return fmt.Errorf("record batcher %s: %w: %d held before the topic's partitions were read", r.cfg.Name, ErrUndelivered, len(held))
}

// leaders reads the topic's partitions' leaders (broker ids, by partition).
func (r *RecordBatcher) leaders(ctx context.Context) ([]int, error) {
	bo := newBackoff(r.cfg.InitialBackoff, r.cfg.MaxBackoff)
	for {
		resp, err := r.client.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{r.cfg.Topic}})
		if err == nil {
			err = fmt.Errorf("topic %s: not in the metadata", r.cfg.Topic)
			for _, t := range resp.Topics {
				switch {
				case t.Name != r.cfg.Topic:
				case t.Error != nil:
					err = t.Error
				case len(t.Partitions) == 0:
					err = fmt.Errorf("topic %s has no partitions", r.cfg.Topic)
				default:
					out := make([]int, len(t.Partitions))
					for _, p := range t.Partitions {
						if p.ID < 0 || p.ID >= len(out) {
							return nil, fmt.Errorf("topic %s: partition %d of %d", r.cfg.Topic, p.ID, len(out))
						}
						out[p.ID] = p.Leader.ID
					}
					return out, nil
				}
			}
		}
		wait := min(bo.NextBackOff(), r.cfg.MaxBackoff)
		r.log.Warn("read topic partitions; messages are held in arrival order until then", "topic", r.cfg.Topic, "backoff", wait, "err", err)
		if !tick.Sleep(ctx, wait) {
			return nil, ctx.Err()
		}
	}
}

// flusher is Run's sender: each flush takes at most one batch from every
// partition (its oldest sealed one, else its open one), so a partition has
// one request in flight and its batches land in order, and writes them in
// one produce request per leader broker (acks=all).
type flusher struct {
	r       *RecordBatcher
	parts   []*recordPartition
	leader  []int         // partition → leader broker id (refreshed on leader errors)
	tries   map[int]int   // partition → failed attempts of its oldest batch
	retryAt time.Time     // after a failed write: the backoff's end
	bo      *backoffState // nil until a write fails
	taken   []*recordBatch
}

type backoffState struct{ next func() time.Duration }

// flush writes one batch of every partition that holds one.
func (f *flusher) flush(ctx context.Context) {
	r := f.r
	if d := time.Until(f.retryAt); d > 0 && !tick.Sleep(ctx, d) {
		return
	}
	f.taken = f.taken[:0]
	for _, p := range f.parts {
		var b *recordBatch
		p.mu.Lock()
		if len(p.sealed) > 0 {
			b = p.sealed[0]
			copy(p.sealed, p.sealed[1:])
			p.sealed[len(p.sealed)-1] = nil
			p.sealed = p.sealed[:len(p.sealed)-1]
			r.sealed.Add(-1)
		} else if p.cur != nil {
			b, p.cur = p.cur, nil
		}
		p.mu.Unlock()
		if b != nil {
			b.partition = p.id
			b.seal()
			f.taken = append(f.taken, b)
		}
	}
	if len(f.taken) == 0 {
		return
	}
	// One request per leader; usually one leader per broker in the cluster.
	byLeader := make(map[int][]*recordBatch, 4)
	for _, b := range f.taken {
		byLeader[f.leader[b.partition]] = append(byLeader[f.leader[b.partition]], b)
	}
	errs := make([]error, len(f.taken)) // by position in f.taken, set by send
	index := make(map[*recordBatch]int, len(f.taken))
	for i, b := range f.taken {
		index[b] = i
	}
	var wg sync.WaitGroup
	for _, bs := range byLeader {
		wg.Go(func() {
			for i, err := range f.send(ctx, bs) {
				errs[index[bs[i]]] = err
			}
		})
	}
	wg.Wait()
	f.settle(ctx, errs)
}

// send writes batches (of partitions with one leader) in one produce
// request and returns each one's error.
func (f *flusher) send(ctx context.Context, batches []*recordBatch) []error {
	r := f.r
	out := make([]error, len(batches))
	req := &rawproduce.Request{Acks: int16(kafka.RequireAll), Timeout: int32(r.client.Timeout.Milliseconds()),
		Topics: []rawproduce.RequestTopic{{Topic: r.cfg.Topic, Partitions: make([]rawproduce.RequestPartition, len(batches))}}}
	for i, b := range batches {
		b.rd.reset(b.buf)
		req.Topics[0].Partitions[i] = rawproduce.RequestPartition{Partition: int32(b.partition), RecordSet: protocol.RawRecordSet{Reader: &b.rd}}
	}
	rctx, cancel := context.WithTimeout(ctx, r.client.Timeout)
	defer cancel()
	m, err := r.client.Transport.RoundTrip(rctx, r.client.Addr, req)
	res, ok := m.(*produce.Response)
	if err == nil && !ok {
		err = fmt.Errorf("produce: unexpected response %T", m)
	}
	if err != nil {
		for i := range out {
			out[i] = err
		}
		return out
	}
	byPartition := make(map[int32]int16, len(batches))
	for _, t := range res.Topics {
		for _, p := range t.Partitions {
			byPartition[p.Partition] = p.ErrorCode
		}
	}
	for i, b := range batches {
		code, ok := byPartition[int32(b.partition)]
		switch {
		case !ok:
			out[i] = fmt.Errorf("produce: no answer for partition %d", b.partition)
		case code != 0:
			out[i] = kafka.Error(code)
		}
	}
	return out
}

// settle counts what f.taken's batches became: sent, retried (back at the
// head of their partition, after a backoff), or given up on after
// WriteAttempts (OnFailed).
func (f *flusher) settle(ctx context.Context, errs []error) {
	r := f.r
	var failed error
	for i, b := range f.taken {
		err := errs[i]
		if err == nil {
			delete(f.tries, b.partition)
			r.sent.Add(float64(b.n))
			r.done(b, int(b.n))
			continue
		}
		failed = err
		if f.tries == nil {
			f.tries = map[int]int{}
		}
		f.tries[b.partition]++
		if f.tries[b.partition] >= r.cfg.WriteAttempts {
			delete(f.tries, b.partition)
			f.fail(b, err)
			continue
		}
		p := f.parts[b.partition]
		p.mu.Lock()
		p.sealed = append(p.sealed, nil)
		copy(p.sealed[1:], p.sealed)
		p.sealed[0] = b
		p.mu.Unlock()
		r.sealed.Add(1)
	}
	if failed == nil {
		f.bo, f.retryAt = nil, time.Time{}
		return
	}
	if f.bo == nil {
		bo := newBackoff(r.cfg.InitialBackoff, r.cfg.MaxBackoff)
		f.bo = &backoffState{next: bo.NextBackOff}
	}
	wait := min(f.bo.next(), r.cfg.MaxBackoff)
	f.retryAt = time.Now().Add(wait)
	r.log.Warn("batched write failed; retrying", "batches", len(f.taken), "backoff", wait, "err", failed)
	if leaders, err := r.leadersOnce(ctx); err == nil && len(leaders) == len(f.leader) {
		f.leader = leaders // a leader may have moved
	}
}

// leadersOnce reads the leaders once (no retries).
func (r *RecordBatcher) leadersOnce(ctx context.Context) ([]int, error) {
	c, cancel := context.WithTimeout(ctx, r.client.Timeout)
	defer cancel()
	resp, err := r.client.Metadata(c, &kafka.MetadataRequest{Topics: []string{r.cfg.Topic}})
	if err != nil {
		return nil, err
	}
	for _, t := range resp.Topics {
		if t.Name == r.cfg.Topic && t.Error == nil {
			out := make([]int, len(t.Partitions))
			for _, p := range t.Partitions {
				if p.ID >= 0 && p.ID < len(out) {
					out[p.ID] = p.Leader.ID
				}
			}
			return out, nil
		}
	}
	return nil, fmt.Errorf("topic %s: not in the metadata", r.cfg.Topic)
}

// failAll gives up on every batch still held (the drain deadline passed)
// and returns how many records that was.
func (f *flusher) failAll(cause error) int {
	var n int
	for _, p := range f.parts {
		p.mu.Lock()
		bs := p.sealed
		if p.cur != nil {
			bs = append(bs, p.cur)
		}
		p.sealed, p.cur = nil, nil
		p.mu.Unlock()
		for _, b := range bs {
			b.partition = p.id
			n += int(b.n)
			f.fail(b, cmp.Or(cause, error(context.DeadlineExceeded)))
		}
	}
	return n
}

// fail counts b's records as failed and hands them to OnFailed.
func (f *flusher) fail(b *recordBatch, err error) {
	r := f.r
	n := int(b.n)
	r.failed.Add(float64(n))
	msgs, derr := b.messages(r.cfg.Topic, b.partition)
	switch {
	case derr != nil: // a bug in append or decode, never input
		r.log.Error("batched messages not delivered and not decodable", "messages", n, "err", errors.Join(err, derr))
	case r.cfg.OnFailed == nil:
		r.log.Error("batched messages not delivered", "messages", n, "partition", b.partition, "err", err)
	default:
		r.log.Warn("batched messages not delivered to Kafka; handed on to be kept", "messages", n, "partition", b.partition, "err", err)
		r.cfg.OnFailed(msgs)
	}
	r.done(b, n)
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
