package ledger

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// The quota consumer is a pkg/stream batch consumer: the shared consumer
// gathers a partition's messages for FlushInterval (or MaxBatchEvents), hands
// them to Consumer.handleBatch, and commits the partition's offset only after
// handleBatch returned — by then the batch's units are in DynamoDB, so the
// committed offset never passes a unit that is not durable, whatever kills
// the process. Everything that may be delivered twice (a crash between the
// ledger write and the commit, a former owner still flushing after a
// rebalance, a retried write whose first answer was lost, a dead letter
// replayed twice) is fenced by the conditional writes of Store. The door
// (size limits, replays for other groups), dead letters, group membership
// and commits are pkg/stream's.

// Writer is the ledger: *Store.
type Writer interface {
	ApplyPartition(ctx context.Context, principal, day string, partition int, entries []Entry) (WriteResult, error)
	ApplyReplay(ctx context.Context, principal, day string, partition int, offset, cost int64) (WriteResult, error)
}

// Seeder re-seeds Redis day counters: *Reseeder.
type Seeder interface {
	Reseed(ctx context.Context, seeds []Seed) (int, error)
}

var (
	_ Writer = (*Store)(nil)
	_ Seeder = (*Reseeder)(nil)
)

// Consumer aggregates allowed units per principal-day from the decisions
// topic and writes them to the ledger exactly once.
type Consumer struct {
	cfg     Config
	ledger  Writer
	seeder  Seeder
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time
	window  stream.EventTimeWindow
	stream  *stream.Consumer

	writeSlots chan struct{} // bounds UpdateItem calls in flight

	mu  sync.Mutex
	ids map[int]*recentIDs // per partition, dropped when it is revoked
}

// NewConsumer returns a Consumer; cfg must be valid. Stream metrics go to reg.
func NewConsumer(cfg Config, ledger Writer, seeder Seeder, log *slog.Logger, reg prometheus.Registerer, m *Metrics, now func() time.Time) (*Consumer, error) {
	c := &Consumer{
		cfg: cfg, ledger: ledger, seeder: seeder, log: log.With("topic", cfg.DecisionsTopic, "group", cfg.Group),
		metrics: m, now: now, writeSlots: make(chan struct{}, cfg.WriteConcurrency), ids: map[int]*recentIDs{},
	}
	sc := stream.ConsumerConfig{
		Brokers: cfg.KafkaBrokers, Security: cfg.Kafka, Topic: cfg.DecisionsTopic, GroupID: cfg.Group, Service: "quota",
		// A batch that cannot be written is retried until it can, never
		// dead-lettered: units in the DLQ are units missing from the ledger.
		// Writes retry inside handleBatch; this is the backstop.
		MaxAttempts:       1 << 30,
		InitialBackoff:    50 * time.Millisecond,
		MaxBackoff:        5 * time.Second,
		DrainTimeout:      cfg.DrainTimeout,
		HeartbeatInterval: cfg.HeartbeatInterval,
		SessionTimeout:    cfg.SessionTimeout,
		RebalanceTimeout:  cfg.RebalanceTimeout,
		JoinGroupBackoff:  cfg.JoinGroupBackoff,
		MaxWait:           cfg.MaxWait,
		OnRevoke:          c.revoked,
		Now:               now,
		Tracing:           cfg.Tracing,
		Logger:            log,
		Registerer:        reg,
	}
	cfg.Door.Apply(&sc)
	c.window = sc.EventTimeWindow()
	sc2, err := stream.NewBatchConsumer(sc, stream.BatchConfig{
		MaxMessages: cfg.MaxBatchEvents,
		MaxBytes:    32 << 20, // bounds a partition batch's memory: ~60k decisions of ~0.5 KB
		Linger:      cfg.FlushInterval,
	}, c.handleBatch)
	if err != nil {
		return nil, fmt.Errorf("quota consumer: %w", err)
	}
	c.stream = sc2
	return c, nil
}

// Run consumes until ctx is done, then hands the batches being gathered to
// the ledger (within DrainTimeout), commits and leaves the group. Run returns
// nil after a clean drain; an unflushed batch is not an error for exactness
// (it was not committed and is fenced when redelivered) but is reported.
func (c *Consumer) Run(ctx context.Context) error { return c.stream.Run(ctx) }

// revoked drops a partition's dedupe window when it leaves this consumer.
func (c *Consumer) revoked(partition int) {
	c.mu.Lock()
	defer c.mu.Unlock()
	delete(c.ids, partition)
}

func (c *Consumer) recent(partition int) *recentIDs {
	c.mu.Lock()
	defer c.mu.Unlock()
	r := c.ids[partition]
	if r == nil {
		r = newRecentIDs(c.cfg.DedupeWindow)
		c.ids[partition] = r
	}
	return r
}

// recentIDs remembers the last n decision ids of a partition. Offsets fence
// redelivery of the same message; a producer that retried a write whose
// acknowledgement was lost (a broker crash) leaves the same decision at two
// offsets, and only its id tells them apart. Duplicates of that kind sit close
// together in one partition (the key is the principal), so a bounded window
// catches them; one straddling a restart of this consumer is not caught. Ids
// enter the window only once their batch is in the ledger, so a batch that is
// handled again (after a failed write) is not taken for its own duplicate.
type recentIDs struct {
	ring []string
	next int
	set  map[string]struct{}
}

func newRecentIDs(n int) *recentIDs {
	return &recentIDs{ring: make([]string, n), set: make(map[string]struct{}, n)}
}

func (r *recentIDs) has(id string) bool {
	_, ok := r.set[id]
	return ok
}

// add records id, evicting the oldest when the window is full.
func (r *recentIDs) add(id string) {
	if r.has(id) {
		return
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.set, old)
	}
	r.ring[r.next] = id
	r.set[id] = struct{}{}
	r.next = (r.next + 1) % len(r.ring)
}

// batch is one partition's batch, aggregated.
type batch struct {
	partition int
	days      map[dayKey]*dayAgg
	replays   []replayUnit
	ids       []string        // decision ids counted, in order
	oldest    time.Time       // Kafka timestamp of the first message
	over      map[int64]error // offset → why the ledger refused it (past its day's bound)
}

type dayKey struct{ principal, day string }

type dayAgg struct {
	kind, id string
	entries  []Entry
}

type replayUnit struct {
	kind, id, principal, day string
	partition                int
	offset, cost             int64
}

// handleBatch aggregates b, writes it to the ledger and re-seeds Redis. It
// returns only when the ledger holds every unit of b (or ctx ended at the
// drain or rebalance deadline: then b is not committed and comes again,
// fenced). Undecodable messages, and events outside the event-time window,
// are rejected: the stream dead-letters them before it commits.
func (c *Consumer) handleBatch(ctx context.Context, b *stream.Batch) error {
	recent := c.recent(b.Partition)
	agg := &batch{partition: b.Partition, days: make(map[dayKey]*dayAgg)}
	if len(b.Messages) > 0 {
		agg.oldest = b.Messages[0].Time
	}
	inBatch := make(map[string]struct{})
	for i, msg := range b.Messages {
		if isReplay(msg) {
			if err := c.aggregateReplay(agg, msg); err != nil {
				b.Reject(i, err)
			}
			continue
		}
		d, err := events.DecodeDecision(msg.Value)
		if err != nil {
			c.reject(b, i, stream.Permanent(err))
			continue
		}
		if err := c.window.Check(d.TS); err != nil {
			c.reject(b, i, err)
			continue
		}
		if err := events.CheckCost(d.Cost, c.cfg.MaxEventCost); err != nil {
			c.reject(b, i, err)
			continue
		}
		if _, dup := inBatch[d.ID]; dup || recent.has(d.ID) {
			c.metrics.Messages.WithLabelValues(resultDuplicate).Inc()
			continue
		}
		inBatch[d.ID] = struct{}{}
		agg.ids = append(agg.ids, d.ID)
		if !d.Allowed {
			c.metrics.Messages.WithLabelValues(resultDenied).Inc()
			continue
		}
		c.metrics.Messages.WithLabelValues(resultAllowed).Inc()
		c.metrics.Units.Add(float64(d.Cost))
		k := dayKey{principal: d.Principal.Key(), day: d.TS.UTC().Format(DayLayout)}
		a := agg.days[k]
		if a == nil {
			a = &dayAgg{kind: string(d.Principal.Kind), id: d.Principal.ID}
			agg.days[k] = a
		}
		a.entries = append(a.entries, Entry{Offset: msg.Offset, Cost: d.Cost})
	}
	if err := c.flush(ctx, agg); err != nil {
		c.metrics.Abandoned.Inc()
		return fmt.Errorf("partition %d: batch through offset %d left uncommitted: %w",
			b.Partition, b.Messages[len(b.Messages)-1].Offset, err)
	}
	if len(agg.over) > 0 {
		for i, msg := range b.Messages { // refused by the day bound: dead-lettered, not counted
			if err, ok := agg.over[msg.Offset]; ok && !isReplay(msg) {
				c.metrics.OverDayBound.Inc()
				c.reject(b, i, err)
			}
		}
		c.log.Warn("decisions over their principal's daily bound dead-lettered", "partition", b.Partition, "count", len(agg.over))
	}
	for _, id := range agg.ids {
		recent.add(id)
	}
	return nil
}

func (c *Consumer) reject(b *stream.Batch, i int, err error) {
	c.metrics.Messages.WithLabelValues(resultPoison).Inc()
	c.metrics.DLQ.Inc()
	b.Reject(i, err)
}

// Replays. A dead letter replayed onto the decisions topic keeps its dlq_*
// headers (the dlq-auditor republishes the DLQ message as is). The topic is
// shared by every consumer group, so a replay is meant for the group named in
// dlq_consumer_group:
//   - another group's dead letter was counted here when its original was
//     consumed (this group did not fail it), so the replay is ignored (the
//     stream's door skips those addressed to another group of this topic);
//   - this group's dead letter was not counted (it was dead-lettered instead),
//     so the replay counts, once per original position: the write is fenced by
//     "<dlq_partition>/<dlq_offset>" in the item's replay set, not by the
//     offset the replay itself has, so replaying the same dead letter twice
//     (or a copy of a copy) counts it once.
func isReplay(msg kafka.Message) bool {
	for _, h := range msg.Headers {
		if strings.HasPrefix(h.Key, stream.DLQHeaderPrefix) {
			return true
		}
	}
	return false
}

// aggregateReplay adds a replayed dead letter to agg; an error means the
// message must be dead-lettered again.
func (c *Consumer) aggregateReplay(agg *batch, msg kafka.Message) error {
	rec, err := stream.ParseDLQRecord(msg)
	if err != nil {
		c.metrics.Messages.WithLabelValues(resultPoison).Inc()
		c.metrics.DLQ.Inc()
		return stream.Permanent(err)
	}
	if rec.SourceTopic != c.cfg.DecisionsTopic || rec.ConsumerGroup != c.cfg.Group {
		c.metrics.Messages.WithLabelValues(resultReplayIgnored).Inc()
		return nil
	}
	if rec.Reference {
		c.metrics.Messages.WithLabelValues(resultPoison).Inc()
		c.metrics.DLQ.Inc()
		return stream.Permanent(errors.New("a dead-letter reference has no decision to replay"))
	}
	d, err := events.DecodeDecision(rec.Value)
	if err == nil {
		err = c.window.Check(d.TS)
	}
	if err == nil {
		err = events.CheckCost(d.Cost, c.cfg.MaxEventCost)
	}
	if err != nil {
		c.metrics.Messages.WithLabelValues(resultPoison).Inc()
		c.metrics.DLQ.Inc()
		return stream.Permanent(err)
	}
	c.metrics.Messages.WithLabelValues(resultReplay).Inc()
	if !d.Allowed {
		return nil
	}
	c.metrics.Units.Add(float64(d.Cost))
	agg.replays = append(agg.replays, replayUnit{
		kind: string(d.Principal.Kind), id: d.Principal.ID, principal: d.Principal.Key(),
		day: d.TS.UTC().Format(DayLayout), partition: rec.Partition, offset: rec.Offset, cost: d.Cost,
	})
	return nil
}

// flush writes b to the ledger (retrying each write with backoff until it is
// answered or ctx ends) and re-seeds Redis from the totals.
func (c *Consumer) flush(ctx context.Context, b *batch) error {
	if len(b.days) == 0 && len(b.replays) == 0 {
		return nil
	}
	start := c.now()
	var (
		mu    sync.Mutex
		seeds = make([]Seed, 0, len(b.days)+len(b.replays))
		wg    sync.WaitGroup
		errs  []error
	)
	record := func(kind, id, day string, res WriteResult, err error) {
		mu.Lock()
		defer mu.Unlock()
		if err != nil {
			errs = append(errs, err)
			return
		}
		c.metrics.FencedUnits.Add(float64(res.Fenced))
		seeds = append(seeds, Seed{Kind: kind, ID: id, Day: day, Total: res.Total})
		for _, e := range res.Over {
			if b.over == nil {
				b.over = map[int64]error{}
			}
			b.over[e.Offset] = &events.DayBoundError{Principal: kind + ":" + id, Day: day, Charged: res.Total, Cost: e.Cost, Bound: res.Bound}
		}
	}
	for k, agg := range b.days {
		wg.Add(1)
		go func() {
			defer wg.Done()
			res, err := c.write(ctx, "partition", func() (WriteResult, error) {
				return c.ledger.ApplyPartition(ctx, k.principal, k.day, b.partition, agg.entries)
			})
			record(agg.kind, agg.id, k.day, res, err)
		}()
	}
	wg.Wait()
	// Replays are rare; written one by one after the partition writes.
	for _, r := range b.replays {
		res, err := c.write(ctx, "replay", func() (WriteResult, error) {
			return c.ledger.ApplyReplay(ctx, r.principal, r.day, r.partition, r.offset, r.cost)
		})
		record(r.kind, r.id, r.day, res, err)
	}
	if len(errs) > 0 {
		return errors.Join(errs...)
	}
	if len(seeds) > 0 {
		rctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		n, err := c.seeder.Reseed(rctx, seeds)
		cancel()
		if err != nil {
			c.metrics.Reseeds.WithLabelValues("error").Add(float64(n))
			c.log.Warn("reseed redis day counters; next flush retries", "partition", b.partition, "err", err)
		} else {
			c.metrics.Reseeds.WithLabelValues("ok").Add(float64(n))
		}
	}
	c.metrics.Flushes.Inc()
	end := c.now()
	c.metrics.FlushSeconds.Observe(end.Sub(start).Seconds())
	if !b.oldest.IsZero() {
		c.metrics.LedgerLag.Observe(max(0, end.Sub(b.oldest).Seconds()))
	}
	return nil
}

// write runs one ledger write under a write slot, retrying errors with
// exponential backoff until it succeeds or ctx ends. Nothing is lost while
// it retries: the batch is neither dropped nor committed.
func (c *Consumer) write(ctx context.Context, kind string, fn func() (WriteResult, error)) (WriteResult, error) {
	var bo *backoff.ExponentialBackOff
	for {
		select {
		case c.writeSlots <- struct{}{}:
		case <-ctx.Done():
			return WriteResult{}, ctx.Err()
		}
		res, err := fn()
		<-c.writeSlots
		c.metrics.Writes.WithLabelValues(kind).Add(float64(res.Writes))
		if err == nil {
			return res, nil
		}
		c.metrics.WriteErrors.Inc()
		if bo == nil {
			bo = newBackoff()
		}
		wait := bo.NextBackOff()
		c.log.Warn("ledger write failed; retrying", "err", err, "backoff", wait)
		if !tick.Sleep(ctx, wait) {
			return WriteResult{}, fmt.Errorf("%w (gave up at the deadline: %w)", err, ctx.Err())
		}
	}
}

func newBackoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = 5 * time.Second
	bo.Reset()
	return bo
}
