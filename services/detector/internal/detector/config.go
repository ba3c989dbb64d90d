package detector

import (
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// ServiceConfig is the detector's start-up configuration, read from the environment.
type ServiceConfig struct {
	HTTPAddr        string   // FLOODGATE_DETECTOR_ADDR: /healthz, /readyz, /metrics
	RedisAddrs      []string // FLOODGATE_REDIS_ADDRS
	KafkaBrokers    []string // FLOODGATE_KAFKA_BROKERS
	DecisionsTopic  string   // FLOODGATE_DECISIONS_TOPIC
	AbuseTopic      string   // FLOODGATE_ABUSE_TOPIC
	Group           string   // FLOODGATE_DETECTOR_GROUP
	PagerGroup      string   // FLOODGATE_PAGER_GROUP
	RapidFire       RapidFireConfig
	Policy          PenaltyPolicy
	Mode            string // FLOODGATE_DETECTOR_MODE: enforce | simulate
	InfluxURL       string // FLOODGATE_INFLUX_URL
	InfluxToken     string // FLOODGATE_INFLUX_TOKEN
	InfluxOrg       string // FLOODGATE_INFLUX_ORG (ignored by InfluxDB 1.8)
	InfluxBucket    string // FLOODGATE_INFLUX_BUCKET ("db/rp" on 1.8)
	PagerRoutingKey string // FLOODGATE_PAGERDUTY_ROUTING_KEY; empty disables paging
	PagerURL        string // FLOODGATE_PAGERDUTY_URL; empty means PagerDuty's Events API
	PagerSeverity   string // FLOODGATE_PAGERDUTY_MIN_SEVERITY
	ShutdownTimeout time.Duration
}

// ServiceConfigFromEnv reads and validates the configuration.
func ServiceConfigFromEnv(getenv config.Getenv) (ServiceConfig, error) {
	e := config.NewEnv(getenv)
	c := ServiceConfig{
		HTTPAddr:       e.String("FLOODGATE_DETECTOR_ADDR", "127.0.0.1:8082"),
		RedisAddrs:     e.List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs),
		KafkaBrokers:   e.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers),
		DecisionsTopic: e.String("FLOODGATE_DECISIONS_TOPIC", config.DefaultDecisionsTopic),
		AbuseTopic:     e.String("FLOODGATE_ABUSE_TOPIC", config.DefaultAbuseTopic),
		Group:          e.String("FLOODGATE_DETECTOR_GROUP", "floodgate-detector"),
		PagerGroup:     e.String("FLOODGATE_PAGER_GROUP", "floodgate-pager"),
		RapidFire: RapidFireConfig{
			Window:    e.Duration("FLOODGATE_DETECTOR_WINDOW", 10*time.Second),
			Threshold: e.Float("FLOODGATE_DETECTOR_RAPID_FIRE_RATE", 20),
			Cooldown:  e.Duration("FLOODGATE_DETECTOR_COOLDOWN", time.Minute),
		},
		Policy: PenaltyPolicy{
			Multiplier: e.Float("FLOODGATE_DETECTOR_PENALTY_MULTIPLIER", 0.1),
			TTL:        e.Duration("FLOODGATE_DETECTOR_PENALTY_TTL", 5*time.Minute),
		},
		Mode:            e.String("FLOODGATE_DETECTOR_MODE", "enforce"),
		InfluxURL:       e.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL),
		InfluxToken:     e.String("FLOODGATE_INFLUX_TOKEN", ""),
		InfluxOrg:       e.String("FLOODGATE_INFLUX_ORG", ""),
		InfluxBucket:    e.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket),
		PagerRoutingKey: e.String("FLOODGATE_PAGERDUTY_ROUTING_KEY", ""),
		PagerURL:        e.String("FLOODGATE_PAGERDUTY_URL", ""),
		PagerSeverity:   e.String("FLOODGATE_PAGERDUTY_MIN_SEVERITY", "high"),
		ShutdownTimeout: e.Duration("FLOODGATE_SHUTDOWN_TIMEOUT", 10*time.Second),
	}
	if err := e.Err(); err != nil {
		return ServiceConfig{}, err
	}
	c.Policy.Enforce = c.Mode == "enforce"
	return c, c.Validate()
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c ServiceConfig) Validate() error {
	var v config.Check
	v.Require(len(c.RedisAddrs) > 0, "FLOODGATE_REDIS_ADDRS", "at least one host:port")
	v.Require(len(c.KafkaBrokers) > 0, "FLOODGATE_KAFKA_BROKERS", "at least one host:port")
	v.Require(c.DecisionsTopic != "" && c.AbuseTopic != "", "FLOODGATE_DECISIONS_TOPIC/FLOODGATE_ABUSE_TOPIC", "required")
	v.Require(c.Group != "" && c.PagerGroup != "" && c.Group != c.PagerGroup, "FLOODGATE_DETECTOR_GROUP/FLOODGATE_PAGER_GROUP", "two different, non-empty consumer groups")
	w := c.RapidFire.Window
	v.Require(w >= time.Second && w <= 10*time.Minute && w%time.Second == 0, "FLOODGATE_DETECTOR_WINDOW", "%s: whole seconds in 1s..10m", w)
	v.Require(c.RapidFire.Threshold > 0, "FLOODGATE_DETECTOR_RAPID_FIRE_RATE", "%g: must be positive (events per second)", c.RapidFire.Threshold)
	v.Require(c.RapidFire.Cooldown >= 0, "FLOODGATE_DETECTOR_COOLDOWN", "must not be negative")
	v.Require(c.Policy.Multiplier > 0 && c.Policy.Multiplier <= 1, "FLOODGATE_DETECTOR_PENALTY_MULTIPLIER", "%g: must be in (0, 1]", c.Policy.Multiplier)
	v.Require(c.Policy.TTL >= time.Second && c.Policy.TTL <= 30*24*time.Hour, "FLOODGATE_DETECTOR_PENALTY_TTL", "%s: must be in 1s..720h", c.Policy.TTL)
	v.Require(c.Mode == "enforce" || c.Mode == "simulate", "FLOODGATE_DETECTOR_MODE", "%q is not one of enforce|simulate", c.Mode)
	v.Require(c.InfluxURL != "" && c.InfluxBucket != "", "FLOODGATE_INFLUX_URL/FLOODGATE_INFLUX_BUCKET", "required")
	_, sevOK := severityRank[events.Severity(c.PagerSeverity)]
	v.Require(sevOK, "FLOODGATE_PAGERDUTY_MIN_SEVERITY", "%q is not one of low|medium|high|critical", c.PagerSeverity)
	v.Require(c.ShutdownTimeout > 0, "FLOODGATE_SHUTDOWN_TIMEOUT", "must be positive")
	return v.Err()
}
