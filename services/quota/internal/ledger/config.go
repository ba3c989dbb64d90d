package ledger

import (
	"errors"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/config/backends"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// Config is the quota service's start-up configuration, read from the environment.
type Config struct {
	HTTPAddr string // FLOODGATE_QUOTA_ADDR: usage API, /healthz, /readyz, /metrics
	// Tokens are the usage API's callers, a token spec (pkg/httpapi:
	// name:reader:sha256hex entries) in FLOODGATE_QUOTA_TOKENS or the file
	// FLOODGATE_QUOTA_TOKENS_FILE names; required unless HTTPAddr is a
	// loopback address (issue 22 S14: usage was readable by anyone).
	Tokens          config.Secret
	config.Backends // FLOODGATE_REDIS_*, FLOODGATE_KAFKA_*
	// Kafka is KafkaSecurity built and checked at start-up (stream.Secure);
	// nil is plaintext.
	Kafka          *stream.Security
	DecisionsTopic string // FLOODGATE_DECISIONS_TOPIC
	Group          string // FLOODGATE_QUOTA_GROUP
	Dynamo         dynamo.Options

	// FlushInterval is how long a partition's batch gathers decisions (from
	// its first) before it is written to the ledger and committed
	// (FLOODGATE_QUOTA_FLUSH_INTERVAL): the batch consumer's linger.
	FlushInterval time.Duration
	// MaxBatchEvents flushes a partition early when this many messages were
	// aggregated, bounding memory (FLOODGATE_QUOTA_MAX_BATCH_EVENTS).
	MaxBatchEvents int
	// DedupeWindow is how many recent decision ids each partition remembers, so a
	// decision the producer wrote twice (a retry after a lost acknowledgement:
	// same id, another offset) is counted once (FLOODGATE_QUOTA_DEDUPE_WINDOW).
	DedupeWindow int
	// WriteConcurrency bounds the UpdateItem calls in flight across all
	// partitions (FLOODGATE_QUOTA_WRITE_CONCURRENCY).
	WriteConcurrency int
	// RetentionDays is how long a ledger item lives after its day ends
	// (FLOODGATE_QUOTA_RETENTION_DAYS), enforced by the table's TTL.
	RetentionDays int
	// ReseedMargin is added to the end of the day for the TTL of a re-seeded
	// Redis day counter (FLOODGATE_QUOTA_RESEED_MARGIN).
	ReseedMargin time.Duration
	// DrainTimeout bounds the last flush on shutdown and on a rebalance
	// (FLOODGATE_QUOTA_DRAIN_TIMEOUT).
	DrainTimeout time.Duration
	// Consumer-group timings; zero keeps kafka-go's defaults
	// (FLOODGATE_QUOTA_SESSION_TIMEOUT, _HEARTBEAT_INTERVAL, _REBALANCE_TIMEOUT,
	// _JOIN_BACKOFF).
	SessionTimeout    time.Duration
	HeartbeatInterval time.Duration
	RebalanceTimeout  time.Duration
	JoinGroupBackoff  time.Duration
	// MaxWait bounds one fetch (FLOODGATE_QUOTA_FETCH_MAX_WAIT).
	MaxWait time.Duration
	// Door holds the checks every decision passes before it is counted: size
	// and decompression limits (FLOODGATE_STREAM_MAX_MESSAGE_BYTES,
	// FLOODGATE_STREAM_MAX_DECOMPRESSED_BYTES) and the event-time window
	// (FLOODGATE_EVENT_MAX_FUTURE, FLOODGATE_EVENT_MAX_AGE).
	Door stream.DoorLimits
	// MaxEventCost bounds one decision's cost (FLOODGATE_EVENT_MAX_COST,
	// default events.DefaultMaxCost, the limiter's default max_cost): a
	// decision over it is dead-lettered with the reason and counts nothing
	// (issue 22 S3). Raise it with the rules' max_cost.
	MaxEventCost int64
	// DayBounds is what one principal may be charged per UTC day from the
	// stream: the largest daily quota of its kind (FLOODGATE_EVENT_DAY_QUOTAS,
	// kind=units,…; default events.DefaultDayQuotas, the built-in rules'; none
	// for no bound) plus FLOODGATE_EVENT_DAY_SLACK percent (default 10). An
	// allowed decision past it is dead-lettered with the reason and counts
	// nothing (issue 37).
	DayQuotas string
	DaySlack  int
	DayBounds events.DayBounds
	// Tracing makes every batch a "process" span linking its decisions'
	// creation contexts (the service's OTEL_* tracing; off by default).
	Tracing tracing.Tracing
}

// Defaults.
const (
	DefaultAddr           = "127.0.0.1:8085"
	DefaultGroup          = "floodgate-quota"
	DefaultFlushInterval  = time.Second
	DefaultMaxBatchEvents = 200_000
	DefaultDedupeWindow   = 65_536
	DefaultConcurrency    = 32
	DefaultRetentionDays  = 400
	DefaultReseedMargin   = time.Hour
	DefaultDrainTimeout   = 10 * time.Second
)

// ConfigFromEnv reads and validates the configuration.
func ConfigFromEnv(getenv config.Getenv) (Config, error) {
	e := config.NewEnv(getenv)
	c := Config{
		HTTPAddr:       e.String("FLOODGATE_QUOTA_ADDR", DefaultAddr),
		Tokens:         e.Secret("FLOODGATE_QUOTA_TOKENS", "FLOODGATE_QUOTA_TOKENS_FILE"),
		Backends:       backends.Read(e),
		DecisionsTopic: e.String("FLOODGATE_DECISIONS_TOPIC", config.DefaultDecisionsTopic),
		Group:          e.String("FLOODGATE_QUOTA_GROUP", DefaultGroup),
		Dynamo: dynamo.Options{
			Endpoint:    e.String("FLOODGATE_DYNAMODB_ENDPOINT", ""),
			Region:      e.String("FLOODGATE_DYNAMODB_REGION", ""),
			TablePrefix: e.String("FLOODGATE_DYNAMODB_TABLE_PREFIX", ""),
		},
		FlushInterval:     e.Duration("FLOODGATE_QUOTA_FLUSH_INTERVAL", DefaultFlushInterval),
		MaxBatchEvents:    e.Int("FLOODGATE_QUOTA_MAX_BATCH_EVENTS", DefaultMaxBatchEvents),
		DedupeWindow:      e.Int("FLOODGATE_QUOTA_DEDUPE_WINDOW", DefaultDedupeWindow),
		WriteConcurrency:  e.Int("FLOODGATE_QUOTA_WRITE_CONCURRENCY", DefaultConcurrency),
		RetentionDays:     e.Int("FLOODGATE_QUOTA_RETENTION_DAYS", DefaultRetentionDays),
		ReseedMargin:      e.Duration("FLOODGATE_QUOTA_RESEED_MARGIN", DefaultReseedMargin),
		DrainTimeout:      e.Duration("FLOODGATE_QUOTA_DRAIN_TIMEOUT", DefaultDrainTimeout),
		SessionTimeout:    e.Duration("FLOODGATE_QUOTA_SESSION_TIMEOUT", stream.DefaultSessionTimeout),
		HeartbeatInterval: e.Duration("FLOODGATE_QUOTA_HEARTBEAT_INTERVAL", stream.DefaultHeartbeatInterval),
		RebalanceTimeout:  e.Duration("FLOODGATE_QUOTA_REBALANCE_TIMEOUT", stream.DefaultRebalanceTimeout),
		JoinGroupBackoff:  e.Duration("FLOODGATE_QUOTA_JOIN_BACKOFF", 0),
		MaxWait:           e.Duration("FLOODGATE_QUOTA_FETCH_MAX_WAIT", 500*time.Millisecond),
		MaxEventCost:      int64(e.Int("FLOODGATE_EVENT_MAX_COST", events.DefaultMaxCost)),
		DayQuotas:         e.String("FLOODGATE_EVENT_DAY_QUOTAS", events.DefaultDayQuotas),
		DaySlack:          e.Int("FLOODGATE_EVENT_DAY_SLACK", events.DefaultDaySlackPercent),
		Door:              stream.ReadDoorLimits(e),
	}
	c.DayBounds, _ = events.ParseDayBounds(c.DayQuotas, c.DaySlack) // an error is Validate's
	return config.Validated(c, e.Err())
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c Config) Validate() error {
	var v config.Check
	v.Require(c.HTTPAddr != "", "FLOODGATE_QUOTA_ADDR", "required (host:port)")
	v.Require(c.Tokens != "" || config.LoopbackOnly(c.HTTPAddr), "FLOODGATE_QUOTA_TOKENS",
		"required when FLOODGATE_QUOTA_ADDR (%s) is not a loopback address: anyone could read every principal's usage", c.HTTPAddr)
	v.Require(len(c.KafkaBrokers) > 0, "FLOODGATE_KAFKA_BROKERS", "at least one host:port")
	v.Require(c.DecisionsTopic != "", "FLOODGATE_DECISIONS_TOPIC", "required")
	v.Require(c.Group != "", "FLOODGATE_QUOTA_GROUP", "required")
	v.Require(len(c.RedisAddrs) > 0, "FLOODGATE_REDIS_ADDRS", "at least one host:port")
	v.Require(c.FlushInterval >= 10*time.Millisecond && c.FlushInterval <= time.Minute,
		"FLOODGATE_QUOTA_FLUSH_INTERVAL", "%s: must be in 10ms..1m", c.FlushInterval)
	v.Require(c.MaxBatchEvents >= 1 && c.MaxBatchEvents <= 10_000_000,
		"FLOODGATE_QUOTA_MAX_BATCH_EVENTS", "%d: must be in 1..10000000", c.MaxBatchEvents)
	v.Require(c.DedupeWindow >= 1 && c.DedupeWindow <= 10_000_000,
		"FLOODGATE_QUOTA_DEDUPE_WINDOW", "%d: must be in 1..10000000", c.DedupeWindow)
	v.Require(c.WriteConcurrency >= 1 && c.WriteConcurrency <= 1024,
		"FLOODGATE_QUOTA_WRITE_CONCURRENCY", "%d: must be in 1..1024", c.WriteConcurrency)
	v.Require(c.RetentionDays >= 1 && c.RetentionDays <= 3650,
		"FLOODGATE_QUOTA_RETENTION_DAYS", "%d: must be in 1..3650", c.RetentionDays)
	v.Require(c.ReseedMargin >= 0 && c.ReseedMargin <= 48*time.Hour,
		"FLOODGATE_QUOTA_RESEED_MARGIN", "%s: must be in 0..48h", c.ReseedMargin)
	v.Require(c.DrainTimeout > 0, "FLOODGATE_QUOTA_DRAIN_TIMEOUT", "must be positive")
	for _, d := range []struct {
		name string
		v    time.Duration
	}{
		{"FLOODGATE_QUOTA_SESSION_TIMEOUT", c.SessionTimeout},
		{"FLOODGATE_QUOTA_HEARTBEAT_INTERVAL", c.HeartbeatInterval},
		{"FLOODGATE_QUOTA_REBALANCE_TIMEOUT", c.RebalanceTimeout},
		{"FLOODGATE_QUOTA_JOIN_BACKOFF", c.JoinGroupBackoff},
	} {
		v.Require(d.v >= 0, d.name, "must not be negative")
	}
	if c.SessionTimeout > 0 && c.HeartbeatInterval > 0 {
		v.Require(3*c.HeartbeatInterval <= c.SessionTimeout, "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL",
			"%s: must be at most a third of FLOODGATE_QUOTA_SESSION_TIMEOUT (%s)", c.HeartbeatInterval, c.SessionTimeout)
	}
	if c.SessionTimeout > 0 && c.RebalanceTimeout > 0 {
		v.Require(c.RebalanceTimeout >= c.SessionTimeout, "FLOODGATE_QUOTA_REBALANCE_TIMEOUT",
			"%s: must be at least FLOODGATE_QUOTA_SESSION_TIMEOUT (%s)", c.RebalanceTimeout, c.SessionTimeout)
	}
	v.Require(c.MaxWait >= 10*time.Millisecond, "FLOODGATE_QUOTA_FETCH_MAX_WAIT", "%s: must be at least 10ms", c.MaxWait)
	v.Require(c.MaxEventCost >= 1 && c.MaxEventCost <= 1_000_000, "FLOODGATE_EVENT_MAX_COST",
		"%d: must be in 1..1000000 (at least the largest max_cost of the limiter's rules)", c.MaxEventCost)
	_, derr := events.ParseDayBounds(c.DayQuotas, 0)
	v.Require(derr == nil, "FLOODGATE_EVENT_DAY_QUOTAS", "%v (the largest daily quota of each kind in the limiter's rules; none for no bound)", derr)
	v.Require(c.DaySlack >= 0 && c.DaySlack <= 100, "FLOODGATE_EVENT_DAY_SLACK", "%d: must be in 0..100 (percent)", c.DaySlack)
	return errors.Join(v.Err(), c.Door.Validate())
}
