package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/tick"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// Consumer defaults.
const (
	DefaultMaxAttempts    = 5
	DefaultInitialBackoff = 100 * time.Millisecond
	DefaultMaxBackoff     = 5 * time.Second
	DefaultCommitInterval = time.Second
	DefaultDrainTimeout   = 10 * time.Second
	DefaultMaxWait        = time.Second
	// DefaultHeartbeatInterval and DefaultSessionTimeout: a dead member is
	// noticed within ~6s, its partitions reassigned at the next rebalance.
	DefaultHeartbeatInterval = time.Second
	DefaultSessionTimeout    = 6 * time.Second
	// DefaultRebalanceTimeout is how long the coordinator waits for members
	// to rejoin a rebalance: twice DefaultDrainTimeout, so a revoked
	// partition's running handler (or batch) gets its whole drain budget
	// (see revokeTimeout) and a stuck member holds the group for at most 20s
	// (kafka-go's default is 30s).
	DefaultRebalanceTimeout = 2 * DefaultDrainTimeout
)

const (
	drainGrace   = 250 * time.Millisecond // after DrainTimeout, for handlers to notice ctx
	fetchBackoff = 500 * time.Millisecond // after a FetchMessage error
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

// ConsumerConfig configures a Consumer.
type ConsumerConfig struct {
	// Brokers are the bootstrap broker addresses (host:port). Required.
	Brokers []string
	// Security is the TLS and SASL of every connection the consumer makes
	// (group, partition readers, dead-letter producer, offsets); nil is
	// plaintext without authentication.
	Security *Security
	// Topic is consumed. Required.
	Topic string
	// GroupID is the consumer group. Required.
	GroupID string
	// Service names the service in dead-letter records. Required.
	Service string
	// DLQTopic receives dead letters; default Topic + ".dlq". The topic must
	// exist: producers never create topics.
	DLQTopic string
	// MaxAttempts is how many times a transiently failing message is handled
	// before it is dead-lettered; default 5.
	MaxAttempts int
	// InitialBackoff and MaxBackoff bound the exponential, jittered backoff
	// between attempts (also between dead-letter publish retries); defaults
	// 100ms and 5s.
	InitialBackoff time.Duration
	MaxBackoff     time.Duration
	// CommitInterval is how often finished offsets are committed; default
	// 1s. Offsets are also committed on drain.
	CommitInterval time.Duration
	// DrainTimeout is how long in-flight handlers get after ctx is cancelled
	// before their own context is cancelled; default 10s. On a rebalance
	// they get min(DrainTimeout, RebalanceTimeout/2).
	DrainTimeout time.Duration
	// StartOffset is where a group with no committed offset starts:
	// kafka.FirstOffset (the default) or kafka.LastOffset.
	StartOffset int64
	// StartFrom, when set, is called as a partition is assigned with the group's
	// committed offset and returns where to fetch from: that offset, or earlier
	// for a handler that rebuilds state from recent history (a detector refilling
	// its windows after a restart). Messages before the committed offset are
	// handed to the handler again — it must not repeat their effects — and the
	// group's offset is never committed below where it was. It is not called for
	// a partition without a committed offset.
	StartFrom func(ctx context.Context, partition int, committed int64) (int64, error)
	// OnRevoke, when set, is called for each partition of a generation after its
	// handlers finished and its offsets were committed, as the consumer rejoins
	// the group or stops: per-partition state can be dropped.
	OnRevoke func(partition int)

	// Group protocol and fetch tuning. Heartbeats every 1s and a 6s session
	// by default (kafka-go's 3s/30s left a group blind for half a minute
	// after a member died); the rebalance timeout is 20s by default (see
	// DefaultRebalanceTimeout); zero JoinGroupBackoff keeps kafka-go's 5s.
	// HeartbeatInterval must be at most a third of SessionTimeout, so two
	// lost heartbeats do not end a live member's session. MaxWait is the longest a fetch waits for data;
	// it also bounds how long closing the reader takes; default 1s.
	// DeadLetterLogInterval is how long dead letters of one error class are
	// counted into one log line (the first is logged at once); default 10s.
	HeartbeatInterval time.Duration
	SessionTimeout    time.Duration
	RebalanceTimeout  time.Duration
	JoinGroupBackoff  time.Duration
	MaxWait           time.Duration

	DeadLetterLogInterval time.Duration

	// Checks at the door, before any handler sees a message (see door.go).
	// MaxMessageBytes bounds one message (key + value + headers); a larger
	// one is dead-lettered as a reference (ClassOversize) and the partition
	// moves on. It is also the largest dead letter written whole: larger
	// ones (the dlq_* headers added) become references. Default 256 KiB.
	MaxMessageBytes int
	// MaxDecompressedBytes bounds what one fetched record batch may
	// decompress to; a batch over it (a gzip bomb) is never held in memory:
	// its offsets are dead-lettered as one reference (ClassOversize) and the
	// partition moves past it. Default 16 MiB.
	MaxDecompressedBytes int
	// EventTime, when set, reads a message's event time at the door; an
	// event more than MaxEventFuture ahead of Now or more than MaxEventAge
	// behind it is dead-lettered (ClassEventTime) and never reaches the
	// handler, and one whose time cannot be read is poison. Handlers that
	// decode the event anyway can instead check the decoded time with
	// EventTimeWindow() and return its error. Defaults 2m and 15 days.
	EventTime      func(kafka.Message) (time.Time, error)
	MaxEventFuture time.Duration
	MaxEventAge    time.Duration
	// Now is the clock of the event-time window; default time.Now.
	Now func() time.Time

	// Tracing, when on, makes every handler invocation (each attempt) a
	// "process <topic>" consumer span: for one message, the child of the
	// creation context its traceparent header carries (and linked to it);
	// for a batch, a span linking every message's creation context.
	// Off (the zero value) costs nothing.
	Tracing tracing.Tracing

	// TraceHook, when set, is called around every handler invocation — one
	// message, or one batch in batch mode, each attempt — with the context
	// the handler will get; it returns the context to pass on and a function
	// called with the invocation's result. This is where tracing goes.
	TraceHook func(ctx context.Context, inv Invocation) (context.Context, func(error))

	// Logger and Registerer are required.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
}

// Invocation describes one handler call, for TraceHook.
type Invocation struct {
	Topic, Group string
	Partition    int
	FirstOffset  int64
	LastOffset   int64
	Messages     int
	Attempt      int // 1-based
}

// EventTimeWindow is the window the consumer checks event times against
// (with the defaults applied), for handlers that check decoded times
// themselves.
func (c ConsumerConfig) EventTimeWindow() EventTimeWindow {
	d := c.withDefaults()
	return EventTimeWindow{MaxFuture: d.MaxEventFuture, MaxAge: d.MaxEventAge, Now: d.Now}
}

// Validate checks the configuration and how its fields relate. Zero values
// that have defaults are valid. Errors wrap ErrInvalidConfig and name the field.
func (c ConsumerConfig) Validate() error {
	var errs []error
	bad := func(field, format string, args ...any) {
		errs = append(errs, fmt.Errorf("%w: ConsumerConfig.%s: %s", ErrInvalidConfig, field, fmt.Sprintf(format, args...)))
	}
	checkBrokers(c.Brokers, func(msg string) { bad("Brokers", "%s", msg) })
	if c.Topic == "" {
		bad("Topic", "required")
	}
	if c.GroupID == "" {
		bad("GroupID", "required")
	}
	if c.Service == "" {
		bad("Service", "required")
	}
	if c.DLQTopic != "" && c.DLQTopic == c.Topic {
		bad("DLQTopic", "must differ from Topic %q", c.Topic)
	}
	if c.MaxAttempts < 0 {
		bad("MaxAttempts", "must be at least 1 (0 means %d), got %d", DefaultMaxAttempts, c.MaxAttempts)
	}
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"InitialBackoff", c.InitialBackoff}, {"MaxBackoff", c.MaxBackoff},
		{"CommitInterval", c.CommitInterval}, {"DrainTimeout", c.DrainTimeout},
		{"HeartbeatInterval", c.HeartbeatInterval}, {"SessionTimeout", c.SessionTimeout},
		{"RebalanceTimeout", c.RebalanceTimeout}, {"JoinGroupBackoff", c.JoinGroupBackoff},
		{"MaxWait", c.MaxWait}, {"DeadLetterLogInterval", c.DeadLetterLogInterval},
		{"MaxEventFuture", c.MaxEventFuture}, {"MaxEventAge", c.MaxEventAge},
	} {
		if d.v < 0 {
			bad(d.name, "must not be negative, got %v", d.v)
		}
	}
	d := c.withDefaults()
	if d.MaxBackoff < d.InitialBackoff {
		bad("MaxBackoff", "must be at least InitialBackoff (%v), got %v", d.InitialBackoff, d.MaxBackoff)
	}
	if 3*d.HeartbeatInterval > d.SessionTimeout {
		bad("HeartbeatInterval", "must be at most a third of SessionTimeout (%v), got %v", d.SessionTimeout, d.HeartbeatInterval)
	}
	if d.RebalanceTimeout < d.SessionTimeout {
		bad("RebalanceTimeout", "must be at least SessionTimeout (%v), got %v", d.SessionTimeout, d.RebalanceTimeout)
	}
	if c.MaxMessageBytes < 0 || (c.MaxMessageBytes > 0 && c.MaxMessageBytes < 1024) {
		bad("MaxMessageBytes", "must be at least 1024 (0 means %d), got %d", DefaultMaxMessageBytes, c.MaxMessageBytes)
	}
	if c.MaxDecompressedBytes < 0 || (c.MaxDecompressedBytes > 0 && c.MaxDecompressedBytes < d.MaxMessageBytes) {
		bad("MaxDecompressedBytes", "must be at least MaxMessageBytes (%d; 0 means %d), got %d", d.MaxMessageBytes, DefaultMaxDecompressedBytes, c.MaxDecompressedBytes)
	}
	if c.StartOffset != 0 && c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset {
		bad("StartOffset", "must be kafka.FirstOffset (%d) or kafka.LastOffset (%d), got %d", kafka.FirstOffset, kafka.LastOffset, c.StartOffset)
	}
	if c.Logger == nil {
		bad("Logger", "required")
	}
	if c.Registerer == nil {
		bad("Registerer", "required")
	}
	return errors.Join(errs...)
}

func (c ConsumerConfig) withDefaults() ConsumerConfig {
	if c.DLQTopic == "" && c.Topic != "" {
		c.DLQTopic = c.Topic + DLQSuffix
	}
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultMaxAttempts)
	c.InitialBackoff, c.MaxBackoff = BackoffDefaults(c.InitialBackoff, c.MaxBackoff)
	c.CommitInterval = cmp.Or(c.CommitInterval, DefaultCommitInterval)
	c.DrainTimeout = cmp.Or(c.DrainTimeout, DefaultDrainTimeout)
	c.StartOffset = cmp.Or(c.StartOffset, kafka.FirstOffset)
	c.MaxWait = cmp.Or(c.MaxWait, DefaultMaxWait)
	c.HeartbeatInterval = cmp.Or(c.HeartbeatInterval, DefaultHeartbeatInterval)
	c.SessionTimeout = cmp.Or(c.SessionTimeout, DefaultSessionTimeout)
	c.RebalanceTimeout = cmp.Or(c.RebalanceTimeout, DefaultRebalanceTimeout)
	c.DeadLetterLogInterval = cmp.Or(c.DeadLetterLogInterval, DefaultDeadLetterLogInterval)
	c.MaxMessageBytes = cmp.Or(c.MaxMessageBytes, DefaultMaxMessageBytes)
	c.MaxDecompressedBytes = cmp.Or(c.MaxDecompressedBytes, max(DefaultMaxDecompressedBytes, c.MaxMessageBytes))
	c.MaxEventFuture = cmp.Or(c.MaxEventFuture, DefaultMaxEventFuture)
	c.MaxEventAge = cmp.Or(c.MaxEventAge, DefaultMaxEventAge)
	if c.Now == nil {
		c.Now = time.Now
	}
	return c
}

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
// letters, metrics and trace hook. Failed messages are retried and then
// dead-lettered (see Handler and BatchHandler).
type Consumer struct {
	cfg    ConsumerConfig
	window EventTimeWindow
	// exactly one of handler and batch is set
	handler Handler
	batch   *batchMode
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

// groupSession is what the consumer needs of a kafka-go ConsumerGroup.
type groupSession interface {
	Next(ctx context.Context) (*kafka.Generation, error)
	Close() error
}

// generationRun consumes the partitions assigned in one group generation.
type generationRun struct {
	c            *Consumer
	gen          *kafka.Generation
	drainStarted chan time.Time
	parts        map[int]*partitionState // fixed before any goroutine starts
	commitMu     sync.Mutex              // one commit at a time: the loop's and batch flushes'
}

type partitionState struct {
	id    int
	track *offsetTrack
	start atomic.Int64 // where fetching started, -1 while unknown
	lag   atomic.Int64
}

// run starts a goroutine per assigned partition plus a commit loop, all
// inside the generation, and returns when the generation ended (after its
// final commit) or, once ctx is done, after the drain and final commit; the
// generation's goroutines then wait for the group to close it.
func (g *generationRun) run(ctx, hctx context.Context) error {
	c := g.c
	assigned := g.gen.Assignments[c.cfg.Topic]
	g.parts = make(map[int]*partitionState, len(assigned))
	ids := make([]int, 0, len(assigned))
	for _, a := range assigned {
		ps := &partitionState{id: a.ID, track: newOffsetTrack()}
		ps.start.Store(-1)
		g.parts[a.ID] = ps
		ids = append(ids, a.ID)
	}
	c.rebalanceCount.Inc()
	c.log.Info("joined consumer group generation", "generation", g.gen.ID, "partitions", ids)

	// Handlers of this generation are cancelled at the rebalance deadline.
	genHctx, cancelGen := context.WithCancel(hctx)
	defer cancelGen()

	var drained sync.WaitGroup
	for _, a := range assigned {
		drained.Add(1)
		ps := g.parts[a.ID]
		g.gen.Start(func(gctx context.Context) {
			g.consume(ctx, gctx, genHctx, a, ps, &drained)
		})
	}
	result := make(chan error, 1)
	g.gen.Start(func(gctx context.Context) {
		result <- g.commitLoop(ctx, gctx, &drained, cancelGen)
		// Keep the generation open until the group ends it: on shutdown
		// that is Close, after which the group is left, not rejoined.
		<-gctx.Done()
	})
	err := <-result
	for _, ps := range g.parts {
		c.metrics.partitionLag.DeleteLabelValues(c.cfg.Topic, c.cfg.GroupID, strconv.Itoa(ps.id))
	}
	return err
}

// consume fetches one partition from its committed offset and runs its
// messages through the door and the handler, in order, until ctx or gctx is
// done.
func (g *generationRun) consume(ctx, gctx, hctx context.Context, a kafka.PartitionAssignment, ps *partitionState, drained *sync.WaitGroup) {
	defer func() {
		drained.Done()
		<-gctx.Done()
	}()
	c := g.c
	stop, cancelStop := context.WithCancel(gctx)
	defer cancelStop()
	defer context.AfterFunc(ctx, cancelStop)()

	r := c.newPartitionReader(a.ID)
	defer func() {
		if err := r.Close(); err != nil {
			c.log.Warn("close partition reader", "partition", a.ID, "err", err)
		}
	}()
	start := a.Offset
	if c.cfg.StartFrom != nil && a.Offset >= 0 {
		// A rewind rebuilds state from before the committed offset; it is
		// worth a few tries (a broker just back may not answer offset lookups
		// yet), never a partition left unread: after them the partition
		// starts at its committed offset. (On main a failed lookup parked the
		// partition until the next rebalance, which a single instance never
		// has: a bot whose events landed there was never detected.)
		var s int64
		var err error
		for try := 0; try < 3 && stop.Err() == nil; try++ {
			if s, err = c.cfg.StartFrom(stop, a.ID, a.Offset); err == nil {
				break
			}
			tick.Sleep(stop, time.Duration(try+1)*200*time.Millisecond)
		}
		if err != nil {
			c.log.Warn("choose start offset: starting at the committed offset", "partition", a.ID, "committed", a.Offset, "err", err)
			s = a.Offset
		}
		if s >= 0 && s < a.Offset {
			start = s
			ps.track.markCommitted(a.Offset - 1) // re-read history never moves the group back
			c.log.Info("rewound partition", "partition", a.ID, "committed", a.Offset, "from", s)
		}
	}
	if err := r.SetOffset(start); err != nil {
		c.log.Error("set partition offset", "partition", a.ID, "offset", start, "err", err)
		return // ends the generation: the group rebalances and retries
	}
	if a.Offset >= 0 {
		ps.start.Store(a.Offset)
	}
	p := &partitionRun{g: g, ps: ps, r: r, stop: stop, hctx: hctx}
	if c.batch != nil {
		p.consumeBatches()
	} else {
		p.consumeMessages()
	}
}

// partitionRun is one partition's fetch loop within a generation.
type partitionRun struct {
	g    *generationRun
	ps   *partitionState
	r    partitionReader
	stop context.Context // fetching ends
	hctx context.Context // handlers end (drain or rebalance deadline)
}

// fetch returns the next message that must be handled or dead-lettered.
// ok is false when fetching ended (stop is done, or a dead letter could not
// be written before the deadline). Messages that the door settles (a replay
// for another group, an oversize message, an event outside the window, a
// batch over the decompression bound) are settled here and never returned.
// deadline, when not zero, bounds the wait: expired is true when it passed
// with nothing fetched.
func (p *partitionRun) fetch(deadline time.Time) (msg kafka.Message, expired, ok bool) {
	c := p.g.c
	for {
		fctx, cancel := p.stop, context.CancelFunc(func() {})
		if !deadline.IsZero() {
			fctx, cancel = context.WithDeadline(p.stop, deadline)
		}
		m, err := p.r.FetchMessage(fctx)
		cancel()
		if err != nil {
			if p.stop.Err() != nil {
				return kafka.Message{}, false, false
			}
			if !deadline.IsZero() && errors.Is(err, context.DeadlineExceeded) {
				return kafka.Message{}, true, true
			}
			var tooLarge *errBatchTooLarge
			if errors.As(err, &tooLarge) {
				if !p.skipBatch(tooLarge) {
					return kafka.Message{}, false, false
				}
				continue
			}
			c.fetchErrCount.Inc()
			c.log.Warn("fetch message", "partition", p.ps.id, "err", err)
			if !tick.Sleep(p.stop, fetchBackoff) {
				return kafka.Message{}, false, false
			}
			continue
		}
		if !p.ps.track.begin(m.Offset) {
			c.redeliveredCount.Inc()
			continue
		}
		p.ps.start.CompareAndSwap(-1, m.Offset)
		verdict, class, derr := c.door(m)
		switch verdict {
		case doorSkipReplay:
			c.replaySkipped.Inc()
			p.ps.track.finish(m.Offset)
			continue
		case doorReject:
			rec := newDLQRecord(c, m, class, derr, 1, c.cfg.Now())
			if class == ClassOversize {
				rec = rec.asReference()
			}
			if !c.deadLetter(p.hctx, m, rec) {
				c.abandonCount.Inc()
				return kafka.Message{}, false, false
			}
			p.ps.track.finish(m.Offset)
			continue
		}
		return m, false, true
	}
}

// skipBatch dead-letters a record batch refused for its decompressed size as
// one reference and moves the reader past it.
func (p *partitionRun) skipBatch(e *errBatchTooLarge) bool {
	c := p.g.c
	last := e.next - 1
	if !p.ps.track.begin(last) {
		// Already settled in this generation; just move on.
		return p.r.SetOffset(e.next) == nil
	}
	p.ps.start.CompareAndSwap(-1, e.first)
	now := c.cfg.Now()
	rec := DLQRecord{
		SourceTopic: c.cfg.Topic, Partition: p.ps.id, Offset: e.first, Timestamp: now,
		ConsumerGroup: c.cfg.GroupID, Service: c.cfg.Service, ErrorClass: ClassOversize,
		ErrorMessage: e.Error(), Attempts: 1, FirstFailure: now,
		Reference: true, OriginalSize: int64(e.limit),
	}
	if !c.deadLetter(p.hctx, kafka.Message{Partition: p.ps.id, Offset: e.first}, rec) {
		c.abandonCount.Inc()
		return false
	}
	p.ps.track.finish(last)
	if err := p.r.SetOffset(e.next); err != nil {
		c.log.Error("move past a refused batch", "partition", p.ps.id, "offset", e.next, "err", err)
		return false
	}
	return true
}

// consumeMessages is per-message mode: each message is handled on its own.
func (p *partitionRun) consumeMessages() {
	c := p.g.c
	for {
		msg, _, ok := p.fetch(time.Time{})
		if !ok {
			return
		}
		if p.stop.Err() != nil {
			// Fetched, never started: it stays pending, so nothing at or
			// after it is committed.
			return
		}
		msgs := []kafka.Message{msg}
		if !c.handleUnit(p.hctx, msgs, c.messageCall) {
			c.abandonCount.Inc()
			return
		}
		p.ps.track.finish(msg.Offset)
	}
}

// messageCall adapts a Handler to the shared middleware.
func (c *Consumer) messageCall(ctx context.Context, msgs []kafka.Message, _ int) ([]rejection, error) {
	return nil, c.handler(ctx, msgs[0])
}

// commitLoop commits finished offsets every CommitInterval and refreshes the
// lag gauges. When ctx is done (shutdown) or gctx is done (rebalance) it
// waits for the partitions to drain, commits a last time, and returns.
func (g *generationRun) commitLoop(ctx, gctx context.Context, drained *sync.WaitGroup, cancelHandlers context.CancelFunc) error {
	c := g.c
	t := time.NewTicker(c.cfg.CommitInterval)
	defer t.Stop()
	var deadline time.Time
	var why string
loop:
	for {
		select {
		case <-t.C:
			if err := g.commit(); err != nil {
				c.log.Warn("commit offsets; retrying next interval", "err", err)
			}
			g.refreshLag(gctx)
		case <-ctx.Done():
			why = "shutdown"
			started := time.Now()
			select {
			case started = <-g.drainStarted:
				g.drainStarted <- started // for the next reader, if any
			default:
			}
			deadline = started.Add(c.cfg.DrainTimeout + drainGrace)
			break loop
		case <-gctx.Done():
			why = "rebalance"
			budget := c.revokeTimeout()
			time.AfterFunc(budget, cancelHandlers)
			deadline = time.Now().Add(budget + drainGrace)
			break loop
		}
	}
	var errs []error
	if !waitTimeout(drained, deadline) {
		errs = append(errs, fmt.Errorf("%s: handlers still running at the deadline; their messages stay uncommitted", why))
	}
	if err := g.commit(); err != nil {
		errs = append(errs, err)
	}
	inFlight := 0
	for _, ps := range g.parts {
		inFlight += ps.track.inFlight()
	}
	c.log.Info("generation drained", "generation", g.gen.ID, "reason", why, "uncommitted_fetched", inFlight)
	if c.cfg.OnRevoke != nil {
		for id := range g.parts {
			c.cfg.OnRevoke(id)
		}
	}
	return errors.Join(errs...)
}

// refreshLag sets each owned partition's lag to its high watermark minus the
// position the group would resume from (the end of the finished prefix). A
// partition whose handler is stuck keeps its position while the watermark
// moves on, so it shows lag — unlike a lag taken from the last message
// handled, which stays at what it was when that message finished.
func (g *generationRun) refreshLag(ctx context.Context) {
	c := g.c
	if len(g.parts) == 0 {
		return
	}
	reqs := make([]kafka.OffsetRequest, 0, len(g.parts))
	for id := range g.parts {
		reqs = append(reqs, kafka.LastOffsetOf(id))
	}
	lctx, cancel := context.WithTimeout(ctx, max(c.cfg.CommitInterval, time.Second))
	defer cancel()
	resp, err := c.offsets.ListOffsets(lctx, &kafka.ListOffsetsRequest{Topics: map[string][]kafka.OffsetRequest{c.cfg.Topic: reqs}})
	if err != nil {
		if ctx.Err() == nil {
			c.log.Debug("list end offsets for lag", "err", err)
		}
		return
	}
	var total int64
	for _, po := range resp.Topics[c.cfg.Topic] {
		ps := g.parts[po.Partition]
		if ps == nil || po.Error != nil {
			continue
		}
		pos := ps.track.position()
		if pos < 0 {
			pos = ps.start.Load()
		}
		if pos < 0 {
			continue
		}
		l := max(0, po.LastOffset-pos)
		ps.lag.Store(l)
		c.metrics.partitionLag.WithLabelValues(c.cfg.Topic, c.cfg.GroupID, strconv.Itoa(ps.id)).Set(float64(l))
	}
	for _, ps := range g.parts {
		total += ps.lag.Load()
	}
	c.lag.Set(float64(total))
}

// commit commits, for every partition of the generation, the end of its
// finished prefix if it moved since the last commit.
func (g *generationRun) commit() error {
	c := g.c
	g.commitMu.Lock()
	defer g.commitMu.Unlock()
	offsets := make(map[int]int64)
	for id, ps := range g.parts {
		if off, ok := ps.track.commitPoint(); ok {
			offsets[id] = off + 1 // the committed offset is the next one to read
		}
	}
	if len(offsets) == 0 {
		return nil
	}
	if err := g.gen.CommitOffsets(map[string]map[int]int64{c.cfg.Topic: offsets}); err != nil {
		c.commitErrCount.Inc()
		return fmt.Errorf("commit offsets of %d partitions: %w", len(offsets), err)
	}
	c.commitCount.Inc()
	for id, off := range offsets {
		g.parts[id].track.markCommitted(off - 1)
	}
	return nil
}

// revokeTimeout is how long a running handler may take when the group
// rebalances: the broker waits RebalanceTimeout for members to rejoin.
func (c *Consumer) revokeTimeout() time.Duration {
	return min(c.cfg.DrainTimeout, c.cfg.RebalanceTimeout/2)
}

// waitTimeout waits for wg until deadline and reports whether it finished.
func waitTimeout(wg *sync.WaitGroup, deadline time.Time) bool {
	done := make(chan struct{})
	go func() {
		wg.Wait()
		close(done)
	}()
	t := time.NewTimer(time.Until(deadline))
	defer t.Stop()
	select {
	case <-done:
		return true
	case <-t.C:
		return false
	}
}

func (c *Consumer) newBackoff() *backoff.ExponentialBackOff {
	return newBackoff(c.cfg.InitialBackoff, c.cfg.MaxBackoff)
}

// BackoffDefaults fills in zero backoff bounds: initial defaults to
// DefaultInitialBackoff, maxInterval to DefaultMaxBackoff or initial,
// whichever is larger.
func BackoffDefaults(initial, maxInterval time.Duration) (time.Duration, time.Duration) {
	initial = cmp.Or(initial, DefaultInitialBackoff)
	return initial, cmp.Or(maxInterval, max(DefaultMaxBackoff, initial))
}

// newBackoff is a jittered exponential backoff from initial up to maxInterval.
func newBackoff(initial, maxInterval time.Duration) *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = initial
	bo.MaxInterval = maxInterval
	bo.Reset()
	return bo
}

// OrDiscard returns l, or a logger that discards everything when l is nil
// (the default of every Logger field in this package and pkg/journal).
func OrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
