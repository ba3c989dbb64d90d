package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// Handler handles one message. It returns nil when the message is done, an
// error wrapped with Permanent (or implementing Permanent() bool) when it can
// never succeed, and any other error to have it retried. ctx is cancelled only
// when the consumer's drain deadline passes, never merely because shutdown
// began. A handler must not modify msg's Key, Value or Headers in place: the
// same bytes go to the dead-letter topic if it fails. Handlers of different
// partitions run concurrently; one partition's messages are handled one at a
// time, in order.
type Handler func(ctx context.Context, msg kafka.Message) error

// partitionReader reads one partition without a group.
type partitionReader interface {
	SetOffset(offset int64) error
	FetchMessage(ctx context.Context) (kafka.Message, error)
	Close() error
}

// publisher writes messages reliably; it must be safe for concurrent use.
type publisher interface {
	Publish(ctx context.Context, msgs ...kafka.Message) error
}

// offsetLister lists the high watermarks of a topic's partitions.
type offsetLister interface {
	ListOffsets(ctx context.Context, req *kafka.ListOffsetsRequest) (*kafka.ListOffsetsResponse, error)
}

var (
	_ partitionReader = (*kafka.Reader)(nil)
	_ groupSession    = (*kafka.ConsumerGroup)(nil)
	_ publisher       = (*Producer)(nil)
	_ offsetLister    = (*kafka.Client)(nil)
)

// Consumer consumes one topic as a member of a consumer group, at least once:
// FetchMessage, handle, then commit. Each assigned partition is fetched and
// handled by its own goroutine, so partitions proceed in parallel while one
// partition's messages are handled in order. Messages pass the door first
// (door.go), then the handler: one message at a time (NewConsumer) or a
// batch at a time (NewBatchConsumer), through the same retries, dead
// letters, metrics and middleware. Failed messages are retried and then
// dead-lettered (see Handler and BatchHandler).
type Consumer struct {
	cfg    ConsumerConfig
	window EventTimeWindow
	// exactly one of handler and batch is set
	handler Handler
	batch   *batchMode
	call    HandlerFunc // the handler inside the middleware (middleware.go)
	log     *slog.Logger
	metrics *Metrics
	dlqLog  *deadLetterLog

	newGroup           func() (groupSession, error)
	newPartitionReader func(partition int) partitionReader
	dlq                publisher
	closeDLQ           func() error
	offsets            offsetLister
	tracer             *Tracer // nil: no spans

	// pre-resolved metric children
	okCount, retriedCount, dlqCount, replaySkipped prometheus.Counter
	retryCount, commitCount                        prometheus.Counter
	commitErrCount, fetchErrCount                  prometheus.Counter
	groupErrCount                                  prometheus.Counter
	redeliveredCount, abandonCount                 prometheus.Counter
	rebalanceCount                                 prometheus.Counter
	handleSeconds                                  prometheus.Observer
	batchMessages                                  prometheus.Observer
	lag                                            prometheus.Gauge
	dlqPublishErrs                                 prometheus.Counter

	ran atomic.Bool
}

// NewConsumer validates cfg, applies its defaults and returns a Consumer that
// hands messages to h one at a time. It connects nothing until Run.
func NewConsumer(cfg ConsumerConfig, h Handler) (*Consumer, error) {
	if h == nil {
		return nil, fmt.Errorf("%w: NewConsumer: handler is nil", ErrInvalidConfig)
	}
	c, err := newConsumer(cfg)
	if err != nil {
		return nil, err
	}
	c.handler = h
	c.call = c.compose(c.messageCall)
	return c, nil
}

func newConsumer(cfg ConsumerConfig) (*Consumer, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	cfg = cfg.withDefaults()
	metrics, err := NewMetrics(cfg.Registerer)
	if err != nil {
		return nil, fmt.Errorf("new consumer %s/%s: %w", cfg.Topic, cfg.GroupID, err)
	}
	log := cfg.Logger.With("topic", cfg.Topic, "group", cfg.GroupID)
	dlq := newProducer(ProducerConfig{
		Brokers:     cfg.Brokers,
		Security:    cfg.Security,
		Topic:       cfg.DLQTopic,
		MaxAttempts: 3, // the consumer retries dead-lettering itself, forever
		Logger:      log,
	}.withDefaults(), metrics)
	c := &Consumer{
		cfg:      cfg,
		window:   cfg.EventTimeWindow(),
		log:      log,
		metrics:  metrics,
		dlq:      dlq,
		closeDLQ: dlq.Close,
		dlqLog:   newDeadLetterLog(log, cfg.DeadLetterLogInterval),
		offsets:  cfg.Security.Client(cfg.Brokers, 5*time.Second),

		okCount:          metrics.consumed.WithLabelValues(cfg.Topic, cfg.GroupID, outcomeOK),
		retriedCount:     metrics.consumed.WithLabelValues(cfg.Topic, cfg.GroupID, outcomeRetried),
		dlqCount:         metrics.consumed.WithLabelValues(cfg.Topic, cfg.GroupID, outcomeDLQ),
		replaySkipped:    metrics.consumed.WithLabelValues(cfg.Topic, cfg.GroupID, outcomeReplaySkipped),
		retryCount:       metrics.retries.WithLabelValues(cfg.Topic, cfg.GroupID),
		commitCount:      metrics.commits.WithLabelValues(cfg.Topic, cfg.GroupID),
		commitErrCount:   metrics.commitErrors.WithLabelValues(cfg.Topic, cfg.GroupID),
		fetchErrCount:    metrics.fetchErrors.WithLabelValues(cfg.Topic, cfg.GroupID),
		groupErrCount:    metrics.groupErrors.WithLabelValues(cfg.Topic, cfg.GroupID),
		redeliveredCount: metrics.redelivered.WithLabelValues(cfg.Topic, cfg.GroupID),
		abandonCount:     metrics.abandoned.WithLabelValues(cfg.Topic, cfg.GroupID),
		rebalanceCount:   metrics.rebalances.WithLabelValues(cfg.Topic, cfg.GroupID),
		handleSeconds:    metrics.handleSeconds.WithLabelValues(cfg.Topic, cfg.GroupID),
		batchMessages:    metrics.batchMessages.WithLabelValues(cfg.Topic, cfg.GroupID),
		lag:              metrics.lag.WithLabelValues(cfg.Topic, cfg.GroupID),
		dlqPublishErrs:   metrics.dlqPublishErrors.WithLabelValues(cfg.Topic),
	}
	c.tracer = NewTracer(cfg.Tracing)
	dlq.tracer = c.tracer
	// The consumer drives kafka-go's ConsumerGroup itself rather than a
	// group Reader: a group Reader gives no sign of revoked partitions, so
	// its user keeps handling and committing partitions that moved to
	// another member, and commits there can move the group's offsets back.
	// Per generation we know the assignment, commit only what we own, and
	// commit before rejoining.
	c.newGroup = func() (groupSession, error) {
		return kafka.NewConsumerGroup(kafka.ConsumerGroupConfig{
			ID:                    cfg.GroupID,
			Brokers:               cfg.Brokers,
			Dialer:                cfg.Security.Dialer(),
			Topics:                []string{cfg.Topic},
			StartOffset:           cfg.StartOffset,
			HeartbeatInterval:     cfg.HeartbeatInterval,
			SessionTimeout:        cfg.SessionTimeout,
			RebalanceTimeout:      cfg.RebalanceTimeout,
			JoinGroupBackoff:      cfg.JoinGroupBackoff,
			WatchPartitionChanges: true,
			ErrorLogger:           kafkaLogger(log, slog.LevelWarn, "kafka consumer group"),
		})
	}
	c.newPartitionReader = func(partition int) partitionReader {
		return newKgoPartitionReader(cfg.Brokers, cfg.Security, cfg.Topic, partition, cfg.MaxWait, cfg.MaxDecompressedBytes, log)
	}
	return c, nil
}

// Run consumes until ctx is done, then drains: it stops fetching, lets the
// handlers that are running finish (their context is cancelled DrainTimeout
// after ctx), commits every finished offset and leaves the group. In
// per-message mode, messages fetched but not started stay uncommitted, to be
// redelivered; in batch mode the batch being gathered is handed to the
// handler as it stands. Run returns nil after a clean drain, and an error if
// the final commit failed or a handler outlived the drain deadline (nothing
// is lost then either: what was not committed is redelivered). Run may be
// called once.
//
// Rebalances are handled the same way: when the group rebalances, every
// partition of the ending generation stops fetching, its running handler (or
// batch) gets until min(DrainTimeout, RebalanceTimeout/2) to finish, and the
// finished offsets are committed before the consumer rejoins. A handler still
// running at that deadline has its context cancelled; its messages are not
// committed, and the partition's next owner gets them again. Offsets are only
// ever committed for partitions this consumer owns in the current generation.
func (c *Consumer) Run(ctx context.Context) error {
	if !c.ran.CompareAndSwap(false, true) {
		return errors.New("stream: Consumer.Run called twice")
	}
	defer c.dlqLog.close()
	defer func() {
		if err := c.closeDLQ(); err != nil {
			c.log.Warn("close dlq producer", "err", err)
		}
	}()

	// Handlers run on a context that outlives ctx by DrainTimeout.
	hctx, cancelHandlers := context.WithCancel(context.WithoutCancel(ctx))
	defer cancelHandlers()
	drainStarted := make(chan time.Time, 1)
	stopAfter := context.AfterFunc(ctx, func() {
		drainStarted <- time.Now()
		time.AfterFunc(c.cfg.DrainTimeout, cancelHandlers)
	})
	defer stopAfter()

	group, err := c.newGroup()
	if err != nil {
		return fmt.Errorf("consumer %s/%s: %w", c.cfg.Topic, c.cfg.GroupID, err)
	}
	c.log.Info("consumer started", "batch", c.batch != nil)

	var errs []error
	for ctx.Err() == nil {
		gen, err := group.Next(ctx)
		if err != nil {
			if ctx.Err() != nil {
				break
			}
			c.groupErrCount.Inc()
			c.log.Warn("join consumer group", "err", err)
			tick.Sleep(ctx, fetchBackoff)
			continue
		}
		g := &generationRun{c: c, gen: gen, drainStarted: drainStarted}
		if err := g.run(ctx, hctx); err != nil {
			if ctx.Err() != nil {
				errs = append(errs, fmt.Errorf("drain: %w", err))
			} else {
				c.log.Warn("end of generation", "generation", gen.ID, "err", err)
			}
		}
	}

	// Leave the group. Closing waits for the generation's goroutines, which
	// have drained already unless a handler ignores its context, and for a
	// join or sync request in flight, which a coordinator in the middle of a
	// rebalance may hold up to the rebalance timeout. What was handled is
	// committed by now, so a leave that does not finish in time is not a
	// failed drain: the coordinator drops this member after its session
	// timeout.
	closed := make(chan struct{})
	go func() {
		_ = group.Close()
		close(closed)
	}()
	select {
	case <-closed:
	case <-time.After(c.cfg.DrainTimeout + drainGrace):
		c.log.Warn("leaving the consumer group timed out; the coordinator drops this member after its session timeout",
			"waited", (c.cfg.DrainTimeout + drainGrace).String())
	}
	c.log.Info("consumer stopped")
	return errors.Join(errs...)
}
