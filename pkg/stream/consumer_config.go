package stream

import (
	"cmp"
	"context"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"

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

	// Middleware wraps every handler invocation — one message, or one batch
	// in batch mode; each attempt — inside the consumer's own (retries, the
	// handle-time histogram, the process span, panic recovery; see
	// middleware.go), the first listed outermost. Composed once, in
	// NewConsumer or NewBatchConsumer.
	Middleware []HandlerMiddleware

	// Logger and Registerer are required.
	Logger     *slog.Logger
	Registerer prometheus.Registerer
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
	v := configCheck{config: "ConsumerConfig"}
	v.brokers(c.Brokers)
	if c.Topic == "" {
		v.bad("Topic", "required")
	}
	if c.GroupID == "" {
		v.bad("GroupID", "required")
	}
	if c.Service == "" {
		v.bad("Service", "required")
	}
	if c.DLQTopic != "" && c.DLQTopic == c.Topic {
		v.bad("DLQTopic", "must differ from Topic %q", c.Topic)
	}
	if c.MaxAttempts < 0 {
		v.bad("MaxAttempts", "must be at least 1 (0 means %d), got %d", DefaultMaxAttempts, c.MaxAttempts)
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
			v.bad(d.name, "must not be negative, got %v", d.v)
		}
	}
	d := c.withDefaults()
	if d.MaxBackoff < d.InitialBackoff {
		v.bad("MaxBackoff", "must be at least InitialBackoff (%v), got %v", d.InitialBackoff, d.MaxBackoff)
	}
	if 3*d.HeartbeatInterval > d.SessionTimeout {
		v.bad("HeartbeatInterval", "must be at most a third of SessionTimeout (%v), got %v", d.SessionTimeout, d.HeartbeatInterval)
	}
	if d.RebalanceTimeout < d.SessionTimeout {
		v.bad("RebalanceTimeout", "must be at least SessionTimeout (%v), got %v", d.SessionTimeout, d.RebalanceTimeout)
	}
	if c.MaxMessageBytes < 0 || (c.MaxMessageBytes > 0 && c.MaxMessageBytes < 1024) {
		v.bad("MaxMessageBytes", "must be at least 1024 (0 means %d), got %d", DefaultMaxMessageBytes, c.MaxMessageBytes)
	}
	if c.MaxDecompressedBytes < 0 || (c.MaxDecompressedBytes > 0 && c.MaxDecompressedBytes < d.MaxMessageBytes) {
		v.bad("MaxDecompressedBytes", "must be at least MaxMessageBytes (%d; 0 means %d), got %d", d.MaxMessageBytes, DefaultMaxDecompressedBytes, c.MaxDecompressedBytes)
	}
	if c.StartOffset != 0 && c.StartOffset != kafka.FirstOffset && c.StartOffset != kafka.LastOffset {
		v.bad("StartOffset", "must be kafka.FirstOffset (%d) or kafka.LastOffset (%d), got %d", kafka.FirstOffset, kafka.LastOffset, c.StartOffset)
	}
	if c.Logger == nil {
		v.bad("Logger", "required")
	}
	if c.Registerer == nil {
		v.bad("Registerer", "required")
	}
	return v.err()
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
