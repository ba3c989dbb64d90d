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
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Why the quota service drives its own consumer-group loop instead of
// pkg/stream.Consumer: that consumer commits an offset once the handler of its
// message returned, one message at a time per partition. Units aggregated in
// memory are not durable when the handler returns, so committing then would
// lose them on kill -9; blocking each handler until the next flush would
// limit a partition to one message per flush interval. Here a partition's
// messages are aggregated for FlushInterval, written to the ledger, and only
// then is the partition's offset committed: the committed offset never
// passes a unit that is not in DynamoDB. Everything that may be delivered
// twice (a crash between the ledger write and the commit, a former owner
// still flushing after a rebalance, a retried write whose first answer was
// lost, a dead letter replayed twice) is fenced by the conditional writes of
// Store. Dead letters, their headers and metrics come from pkg/stream.

// Publisher writes messages reliably (stream.Producer). It must be safe for
// concurrent use.
type Publisher interface {
	Publish(ctx context.Context, msgs ...kafka.Message) error
}

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
	_ Writer    = (*Store)(nil)
	_ Seeder    = (*Reseeder)(nil)
	_ Publisher = (*stream.Producer)(nil)
)

// Consumer aggregates allowed units per principal-day from the decisions
// topic and writes them to the ledger exactly once.
type Consumer struct {
	cfg     Config
	ledger  Writer
	seeder  Seeder
	dlq     Publisher
	log     *slog.Logger
	metrics *Metrics
	now     func() time.Time

	writeSlots chan struct{} // bounds UpdateItem calls in flight
	commitMu   sync.Mutex
}

// NewConsumer returns a Consumer; cfg must be valid.
func NewConsumer(cfg Config, ledger Writer, seeder Seeder, dlq Publisher, log *slog.Logger, m *Metrics, now func() time.Time) *Consumer {
	return &Consumer{
		cfg: cfg, ledger: ledger, seeder: seeder, dlq: dlq, log: log.With("topic", cfg.DecisionsTopic, "group", cfg.Group),
		metrics: m, now: now, writeSlots: make(chan struct{}, cfg.WriteConcurrency),
	}
}

// Run consumes until ctx is done, then flushes what it aggregated (within
// DrainTimeout), commits and leaves the group. Run returns nil after a clean
// drain; an unflushed batch is not an error for exactness (it was not
// committed and is fenced when redelivered) but is reported.
func (c *Consumer) Run(ctx context.Context) error {
	group, err := kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
		ID:                    c.cfg.Group,
		Brokers:               c.cfg.KafkaBrokers,
		Topics:                []string{c.cfg.DecisionsTopic},
		StartOffset:           kafka.FirstOffset,
		HeartbeatInterval:     c.cfg.HeartbeatInterval,
		SessionTimeout:        c.cfg.SessionTimeout,
		RebalanceTimeout:      c.cfg.RebalanceTimeout,
		JoinGroupBackoff:      c.cfg.JoinGroupBackoff,
		WatchPartitionChanges: true,
	})
	if err != nil {
		return fmt.Errorf("quota consumer group %s: %w", c.cfg.Group, err)
	}
	c.log.Info("quota consumer started")
	var errs []error
	for ctx.Err() == nil {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			c.log.Warn("join consumer group", "err", err)
			sleepCtx(ctx, 500*time.Millisecond)
			continue
		}
		if err := c.runGeneration(ctx, gen); err != nil {
			if ctx.Err() != nil {
				errs = append(errs, err)
			} else {
				c.log.Warn("end of generation", "generation", gen.ID, "err", err)
			}
		}
	}
	closed := make(chan struct{})
	go func() {
		_ = group.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(c.cfg.DrainTimeout + time.Second):
		errs = append(errs, errors.New("drain: leaving the consumer group timed out"))
	}
	c.log.Info("quota consumer stopped")
	return errors.Join(errs...)
}

// runGeneration consumes the generation's partitions and returns once each of
// them drained (flushed and committed, or abandoned at the deadline).
func (c *Consumer) runGeneration(ctx context.Context, gen *kafka.Generation) error {
	c.metrics.Rebalances.Inc()
	assigned := gen.Assignments[c.cfg.DecisionsTopic]
	ids := make([]int, 0, len(assigned))
	for _, a := range assigned {
		ids = append(ids, a.ID)
	}
	c.log.Info("joined consumer group generation", "generation", gen.ID, "partitions", ids)

	genDone := make(chan struct{})
	gen.Start(func(gctx context.Context) {
		<-gctx.Done()
		close(genDone)
	})
	var wg sync.WaitGroup
	errCh := make(chan error, len(assigned))
	for _, a := range assigned {
		wg.Add(1)
		gen.Start(func(gctx context.Context) {
			errCh <- c.consumePartition(ctx, gctx, gen, a.ID, a.Offset)
			wg.Done()
			<-gctx.Done() // returning early would end the generation
		})
	}
	select {
	case <-ctx.Done():
	case <-genDone:
	}
	wg.Wait()
	close(errCh)
	var errs []error
	for err := range errCh {
		if err != nil {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// batch is one partition's messages since its last flush.
type batch struct {
	partition int
	days      map[dayKey]*dayAgg
	replays   []replayUnit
	last      int64      // offset of the last message handled, -1 if none
	count     int        // messages handled
	oldest    time.Time  // Kafka timestamp of the first message
	ids       *recentIDs // survives flushes: the partition's recent decision ids
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

func newBatch(partition, dedupeWindow int) *batch {
	return &batch{partition: partition, days: make(map[dayKey]*dayAgg), last: -1, ids: newRecentIDs(dedupeWindow)}
}

// recentIDs remembers the last n decision ids of a partition. Offsets fence
// redelivery of the same message; a producer that retried a write whose
// acknowledgement was lost (a broker crash) leaves the same decision at two
// offsets, and only its id tells them apart. Duplicates of that kind sit close
// together in one partition (the key is the principal), so a bounded window
// catches them; one straddling a restart of this consumer is not caught.
type recentIDs struct {
	ring []string
	next int
	set  map[string]struct{}
}

func newRecentIDs(n int) *recentIDs {
	return &recentIDs{ring: make([]string, n), set: make(map[string]struct{}, n)}
}

// seen records id and reports whether it was already in the window.
func (r *recentIDs) seen(id string) bool {
	if _, ok := r.set[id]; ok {
		return true
	}
	if old := r.ring[r.next]; old != "" {
		delete(r.set, old)
	}
	r.ring[r.next] = id
	r.set[id] = struct{}{}
	r.next = (r.next + 1) % len(r.ring)
	return false
}

func (b *batch) reset() {
	clear(b.days)
	b.replays = b.replays[:0]
	b.count = 0
	b.oldest = time.Time{}
}

// consumePartition fetches one partition from offset, aggregating and
// flushing every FlushInterval, until ctx (shutdown) or gctx (rebalance) is
// done; then it flushes and commits a last time.
func (c *Consumer) consumePartition(ctx, gctx context.Context, gen *kafka.Generation, partition int, offset int64) error {
	stop, cancelStop := context.WithCancel(gctx)
	defer cancelStop()
	defer context.AfterFunc(ctx, cancelStop)()
	// work outlives stop by the drain budget: a flush under way when the
	// partition is revoked gets that long to finish.
	work, cancelWork := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelWork()
	defer context.AfterFunc(stop, func() {
		budget := c.revokeBudget()
		if ctx.Err() != nil {
			budget = c.cfg.DrainTimeout
		}
		time.AfterFunc(budget, cancelWork)
	})()

	r := kafka.NewReader(kafka.ReaderConfig{
		Brokers:   c.cfg.KafkaBrokers,
		Topic:     c.cfg.DecisionsTopic,
		Partition: partition,
		MaxWait:   c.cfg.MaxWait,
		MinBytes:  1,
		MaxBytes:  16 << 20,
	})
	defer r.Close()
	if err := r.SetOffset(offset); err != nil {
		return fmt.Errorf("partition %d: set offset %d: %w", partition, offset, err)
	}
	log := c.log.With("partition", partition)
	b := newBatch(partition, c.cfg.DedupeWindow)
	flushAt := c.now().Add(c.cfg.FlushInterval)
	flush := func() error {
		if b.count == 0 {
			return nil
		}
		if err := c.flush(work, gen, b); err != nil {
			c.metrics.Abandoned.Inc()
			return fmt.Errorf("partition %d: batch through offset %d left uncommitted: %w", partition, b.last, err)
		}
		b.reset()
		return nil
	}
	for {
		fctx, cancel := context.WithDeadline(stop, flushAt)
		msg, err := r.FetchMessage(fctx)
		cancel()
		if err == nil {
			if err := c.handle(work, b, msg); err != nil {
				c.metrics.Abandoned.Inc()
				return fmt.Errorf("partition %d: %w", partition, err)
			}
		} else if stop.Err() != nil {
			break
		} else if !errors.Is(err, context.DeadlineExceeded) {
			log.Warn("fetch message", "err", err)
			sleepCtx(stop, 500*time.Millisecond)
		}
		if now := c.now(); !now.Before(flushAt) || b.count >= c.cfg.MaxBatchEvents {
			if err := flush(); err != nil {
				return err
			}
			flushAt = now.Add(c.cfg.FlushInterval)
		}
	}
	err := flush()
	log.Info("partition drained", "last_offset", b.last, "err", err)
	return err
}

// revokeBudget is how long a revoked partition may keep flushing: the broker
// waits RebalanceTimeout for members to rejoin.
func (c *Consumer) revokeBudget() time.Duration {
	rebalance := c.cfg.RebalanceTimeout
	if rebalance == 0 {
		rebalance = 30 * time.Second
	}
	return min(c.cfg.DrainTimeout, rebalance/2)
}

// handle adds one message to b. Undecodable messages are dead-lettered before
// handle returns, so the batch's commit never passes a message that is neither
// counted nor in the DLQ. It fails only when ctx ends before the dead letter
// is written.
func (c *Consumer) handle(ctx context.Context, b *batch, msg kafka.Message) error {
	if b.count == 0 {
		b.oldest = msg.Time
	}
	b.count++
	b.last = msg.Offset
	if isReplay(msg) {
		return c.handleReplay(ctx, b, msg)
	}
	d, err := events.DecodeDecision(msg.Value)
	if err != nil {
		return c.deadLetter(ctx, msg, stream.DLQRecord{
			Key: msg.Key, Value: msg.Value, Headers: msg.Headers,
			SourceTopic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, Timestamp: msg.Time,
		}, err)
	}
	if b.ids.seen(d.ID) {
		c.metrics.Messages.WithLabelValues(resultDuplicate).Inc()
		return nil
	}
	if !d.Allowed {
		c.metrics.Messages.WithLabelValues(resultDenied).Inc()
		return nil
	}
	c.metrics.Messages.WithLabelValues(resultAllowed).Inc()
	c.metrics.Units.Add(float64(d.Cost))
	k := dayKey{principal: d.Principal.Key(), day: d.TS.UTC().Format(DayLayout)}
	agg := b.days[k]
	if agg == nil {
		agg = &dayAgg{kind: string(d.Principal.Kind), id: d.Principal.ID}
		b.days[k] = agg
	}
	agg.entries = append(agg.entries, Entry{Offset: msg.Offset, Cost: d.Cost})
	return nil
}

// Replays. A dead letter replayed onto the decisions topic keeps its dlq_*
// headers (the dlq-auditor republishes the DLQ message as is). The topic is
// shared by every consumer group, so a replay is meant for the group named in
// dlq_consumer_group:
//   - another group's dead letter was counted here when its original was
//     consumed (this group did not fail it), so the replay is ignored;
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

func (c *Consumer) handleReplay(ctx context.Context, b *batch, msg kafka.Message) error {
	rec, err := stream.ParseDLQRecord(msg)
	if err != nil {
		return c.deadLetter(ctx, msg, stream.DLQRecord{
			Key: msg.Key, Value: msg.Value, Headers: msg.Headers,
			SourceTopic: msg.Topic, Partition: msg.Partition, Offset: msg.Offset, Timestamp: msg.Time,
		}, err)
	}
	if rec.SourceTopic != c.cfg.DecisionsTopic || rec.ConsumerGroup != c.cfg.Group {
		c.metrics.Messages.WithLabelValues(resultReplayIgnored).Inc()
		return nil
	}
	d, err := events.DecodeDecision(rec.Value)
	if err != nil {
		// Dead-letter it again under its original position, so a later
		// replay is still fenced by the same id.
		rec.ErrorMessage = ""
		return c.deadLetter(ctx, msg, rec, err)
	}
	c.metrics.Messages.WithLabelValues(resultReplay).Inc()
	if !d.Allowed {
		return nil
	}
	c.metrics.Units.Add(float64(d.Cost))
	b.replays = append(b.replays, replayUnit{
		kind: string(d.Principal.Kind), id: d.Principal.ID, principal: d.Principal.Key(),
		day: d.TS.UTC().Format(DayLayout), partition: rec.Partition, offset: rec.Offset, cost: d.Cost,
	})
	return nil
}

// deadLetter publishes rec as poison, retrying until it is written or ctx ends.
func (c *Consumer) deadLetter(ctx context.Context, msg kafka.Message, rec stream.DLQRecord, cause error) error {
	rec.ConsumerGroup = c.cfg.Group
	rec.Service = "quota"
	rec.ErrorClass = stream.ClassPoison
	rec.ErrorMessage = cause.Error()
	rec.Attempts = 1
	rec.FirstFailure = c.now()
	out := rec.Message(c.cfg.DecisionsTopic + ".dlq")
	bo := newBackoff()
	for {
		err := c.dlq.Publish(ctx, out)
		if err == nil {
			c.metrics.Messages.WithLabelValues(resultPoison).Inc()
			c.metrics.DLQ.Inc()
			c.log.Warn("message dead-lettered", "partition", msg.Partition, "offset", msg.Offset, "err", cause)
			return nil
		}
		c.log.Error("publish to dlq failed; retrying", "partition", msg.Partition, "offset", msg.Offset, "err", err)
		if !sleepCtx(ctx, bo.NextBackOff()) {
			return fmt.Errorf("dead-letter offset %d: %w", msg.Offset, ctx.Err())
		}
	}
}

// flush writes b to the ledger (retrying each write with backoff until it is
// answered or ctx ends), re-seeds Redis from the totals, and commits the
// offset after b's last message.
func (c *Consumer) flush(ctx context.Context, gen *kafka.Generation, b *batch) error {
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
	c.commit(gen, b.partition, b.last)
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
		if !sleepCtx(ctx, wait) {
			return WriteResult{}, fmt.Errorf("%w (gave up at the deadline: %w)", err, ctx.Err())
		}
	}
}

// commit commits the offset after last. A failed commit is not retried: the
// next flush commits a later offset, and what a crash redelivers meanwhile is
// fenced.
func (c *Consumer) commit(gen *kafka.Generation, partition int, last int64) {
	if last < 0 {
		return
	}
	c.commitMu.Lock()
	defer c.commitMu.Unlock()
	err := gen.CommitOffsets(map[string]map[int]int64{c.cfg.DecisionsTopic: {partition: last + 1}})
	if err != nil {
		c.metrics.Commits.WithLabelValues("error").Inc()
		c.log.Warn("commit offset", "partition", partition, "offset", last+1, "err", err)
		return
	}
	c.metrics.Commits.WithLabelValues("ok").Inc()
}

func newBackoff() *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = 50 * time.Millisecond
	bo.MaxInterval = 5 * time.Second
	bo.Reset()
	return bo
}

// sleepCtx sleeps for d or until ctx is done; it reports whether it slept.
func sleepCtx(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
