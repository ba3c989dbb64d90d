package auditor

import (
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/series"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Defaults of the auditor's configuration.
const (
	DefaultAddr             = "127.0.0.1:8084"
	DefaultGroup            = "floodgate-dlq-auditor"
	DefaultDiscoverInterval = 30 * time.Second
	DefaultRecordTTL        = 14 * 24 * time.Hour // the DLQ topics' retention
	DefaultAlertThreshold   = 50
	DefaultAlertWindow      = 5 * time.Minute
	DefaultReplayRate       = 50.0
	DefaultReplayMax        = 1000
	DefaultCanaryTimeout    = 30 * time.Second
	// DLQSuffix ends the name of every dead-letter topic.
	DLQSuffix = stream.DLQSuffix
)

// ServiceConfig is the auditor's start-up configuration, read from the environment.
type ServiceConfig struct {
	HTTPAddr         string               // FLOODGATE_DLQ_ADDR: API, /healthz, /readyz, /metrics
	KafkaBrokers     []string             // FLOODGATE_KAFKA_BROKERS
	KafkaSecurity    config.KafkaSecurity // FLOODGATE_KAFKA_TLS*, FLOODGATE_KAFKA_SASL_* (docs/configuration.md)
	Group            string               // FLOODGATE_DLQ_GROUP: prefix of the consumer groups, one per *.dlq topic (stream.AuditGroup)
	DiscoverInterval time.Duration        // FLOODGATE_DLQ_DISCOVER_INTERVAL: how often new *.dlq topics are looked for
	DynamoEndpoint   string               // FLOODGATE_DYNAMODB_ENDPOINT; empty = AWS
	TablePrefix      string               // FLOODGATE_DYNAMODB_TABLE_PREFIX
	RecordTTL        time.Duration        // FLOODGATE_DLQ_RECORD_TTL: stored records expire this long after dead-lettering
	series.Influx                         // FLOODGATE_INFLUX_*
	PagerRoutingKey  string               // FLOODGATE_PAGERDUTY_ROUTING_KEY; empty disables paging
	PagerURL         string               // FLOODGATE_PAGERDUTY_URL; empty = PagerDuty's Events API
	AlertThreshold   int                  // FLOODGATE_DLQ_ALERT_THRESHOLD: dead letters per window and source topic that page
	AlertWindow      time.Duration        // FLOODGATE_DLQ_ALERT_WINDOW
	Tokens           config.Secret        // FLOODGATE_DLQ_TOKENS or the file FLOODGATE_DLQ_TOKENS_FILE: the API's callers, a token spec (pkg/httpapi); empty = every API call is refused
	ReplayRate       float64              // FLOODGATE_DLQ_REPLAY_RATE: most messages per second one replay publishes
	ReplayMax        int                  // FLOODGATE_DLQ_REPLAY_MAX: most records one replay or purge may select
	ReplayTopics     []string             // FLOODGATE_DLQ_REPLAY_TOPICS: topics a dead letter may be replayed to besides the one its DLQ serves
	CanaryTimeout    time.Duration        // FLOODGATE_DLQ_CANARY_TIMEOUT: how long a canary may take to be consumed
}

// ServiceConfigFromEnv reads and validates the configuration.
func ServiceConfigFromEnv(getenv config.Getenv) (ServiceConfig, error) {
	e := config.NewEnv(getenv)
	c := ServiceConfig{
		HTTPAddr:         e.String("FLOODGATE_DLQ_ADDR", DefaultAddr),
		KafkaBrokers:     e.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers),
		KafkaSecurity:    config.ReadKafkaSecurity(e),
		Group:            e.String("FLOODGATE_DLQ_GROUP", DefaultGroup),
		DiscoverInterval: e.Duration("FLOODGATE_DLQ_DISCOVER_INTERVAL", DefaultDiscoverInterval),
		DynamoEndpoint:   e.String("FLOODGATE_DYNAMODB_ENDPOINT", ""),
		TablePrefix:      e.String("FLOODGATE_DYNAMODB_TABLE_PREFIX", ""),
		RecordTTL:        e.Duration("FLOODGATE_DLQ_RECORD_TTL", DefaultRecordTTL),
		Influx:           series.ReadInflux(e),
		PagerRoutingKey:  e.String("FLOODGATE_PAGERDUTY_ROUTING_KEY", ""),
		PagerURL:         e.String("FLOODGATE_PAGERDUTY_URL", ""),
		AlertThreshold:   e.Int("FLOODGATE_DLQ_ALERT_THRESHOLD", DefaultAlertThreshold),
		AlertWindow:      e.Duration("FLOODGATE_DLQ_ALERT_WINDOW", DefaultAlertWindow),
		Tokens:           e.Secret("FLOODGATE_DLQ_TOKENS", "FLOODGATE_DLQ_TOKENS_FILE"),
		ReplayRate:       e.Float("FLOODGATE_DLQ_REPLAY_RATE", DefaultReplayRate),
		ReplayMax:        e.Int("FLOODGATE_DLQ_REPLAY_MAX", DefaultReplayMax),
		ReplayTopics:     e.List("FLOODGATE_DLQ_REPLAY_TOPICS", ""),
		CanaryTimeout:    e.Duration("FLOODGATE_DLQ_CANARY_TIMEOUT", DefaultCanaryTimeout),
	}
	return config.Validated(c, e.Err())
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c ServiceConfig) Validate() error {
	var v config.Check
	v.Require(c.HTTPAddr != "", "FLOODGATE_DLQ_ADDR", "required (host:port)")
	v.Require(len(c.KafkaBrokers) > 0, "FLOODGATE_KAFKA_BROKERS", "at least one host:port")
	v.Require(c.Group != "", "FLOODGATE_DLQ_GROUP", "required")
	v.Require(c.DiscoverInterval >= time.Second && c.DiscoverInterval <= time.Hour, "FLOODGATE_DLQ_DISCOVER_INTERVAL", "%s: must be in 1s..1h", c.DiscoverInterval)
	v.Require(c.RecordTTL >= time.Hour && c.RecordTTL <= 400*24*time.Hour, "FLOODGATE_DLQ_RECORD_TTL", "%s: must be in 1h..9600h", c.RecordTTL)
	v.Require(c.InfluxURL != "" && c.InfluxBucket != "", "FLOODGATE_INFLUX_URL/FLOODGATE_INFLUX_BUCKET", "required")
	v.Require(c.AlertThreshold >= 1, "FLOODGATE_DLQ_ALERT_THRESHOLD", "%d: must be at least 1 dead letter per window", c.AlertThreshold)
	v.Require(c.AlertWindow >= 10*time.Second && c.AlertWindow <= 24*time.Hour, "FLOODGATE_DLQ_ALERT_WINDOW", "%s: must be in 10s..24h", c.AlertWindow)
	v.Require(c.ReplayRate > 0 && c.ReplayRate <= 10000, "FLOODGATE_DLQ_REPLAY_RATE", "%g: must be in (0, 10000] messages per second", c.ReplayRate)
	v.Require(c.ReplayMax >= 1 && c.ReplayMax <= 100000, "FLOODGATE_DLQ_REPLAY_MAX", "%d: must be in 1..100000", c.ReplayMax)
	v.Require(c.CanaryTimeout >= time.Second && c.CanaryTimeout <= 10*time.Minute, "FLOODGATE_DLQ_CANARY_TIMEOUT", "%s: must be in 1s..10m", c.CanaryTimeout)
	for _, b := range c.KafkaBrokers {
		v.Require(strings.Contains(b, ":"), "FLOODGATE_KAFKA_BROKERS", "%q is not host:port", b)
	}
	return v.Err()
}
