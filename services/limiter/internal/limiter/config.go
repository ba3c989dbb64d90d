package limiter

import (
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// Config is the limiter's start-up configuration, read from the environment.
type Config struct {
	HTTPAddr        string        // FLOODGATE_LIMITER_ADDR
	RedisAddrs      []string      // FLOODGATE_REDIS_ADDRS
	KafkaBrokers    []string      // FLOODGATE_KAFKA_BROKERS
	DecisionsTopic  string        // FLOODGATE_DECISIONS_TOPIC
	Gateway         string        // FLOODGATE_GATEWAY: names this limiter in decision events
	PrincipalLimit  int           // FLOODGATE_LIMITER_PRINCIPAL_LIMIT: tokens per period per principal
	PrincipalPeriod time.Duration // FLOODGATE_LIMITER_PRINCIPAL_PERIOD
	RedisTimeout    time.Duration // FLOODGATE_LIMITER_REDIS_TIMEOUT: budget of one check
	EventBuffer     int           // FLOODGATE_LIMITER_EVENT_BUFFER: decision events held while Kafka is slow
	ShutdownTimeout time.Duration // FLOODGATE_SHUTDOWN_TIMEOUT
}

// ConfigFromEnv reads the configuration and validates it.
func ConfigFromEnv(getenv config.Getenv) (Config, error) {
	e := config.NewEnv(getenv)
	c := Config{
		HTTPAddr:        e.String("FLOODGATE_LIMITER_ADDR", "127.0.0.1:8080"),
		RedisAddrs:      e.List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs),
		KafkaBrokers:    e.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers),
		DecisionsTopic:  e.String("FLOODGATE_DECISIONS_TOPIC", config.DefaultDecisionsTopic),
		Gateway:         e.String("FLOODGATE_GATEWAY", "local"),
		PrincipalLimit:  e.Int("FLOODGATE_LIMITER_PRINCIPAL_LIMIT", 50),
		PrincipalPeriod: e.Duration("FLOODGATE_LIMITER_PRINCIPAL_PERIOD", time.Second),
		RedisTimeout:    e.Duration("FLOODGATE_LIMITER_REDIS_TIMEOUT", 50*time.Millisecond),
		EventBuffer:     e.Int("FLOODGATE_LIMITER_EVENT_BUFFER", 65536),
		ShutdownTimeout: e.Duration("FLOODGATE_SHUTDOWN_TIMEOUT", 10*time.Second),
	}
	if err := e.Err(); err != nil {
		return Config{}, err
	}
	return c, c.Validate()
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c Config) Validate() error {
	var v config.Check
	v.Require(c.HTTPAddr != "", "FLOODGATE_LIMITER_ADDR", "required")
	v.Require(len(c.RedisAddrs) > 0, "FLOODGATE_REDIS_ADDRS", "at least one host:port")
	v.Require(len(c.KafkaBrokers) > 0, "FLOODGATE_KAFKA_BROKERS", "at least one host:port")
	v.Require(c.DecisionsTopic != "", "FLOODGATE_DECISIONS_TOPIC", "required")
	v.Require(len(c.Gateway) >= 1 && len(c.Gateway) <= 64, "FLOODGATE_GATEWAY", "1 to 64 characters")
	v.Require(c.PrincipalLimit >= 1, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT", "%d: must be at least 1", c.PrincipalLimit)
	v.Require(c.PrincipalPeriod >= time.Millisecond, "FLOODGATE_LIMITER_PRINCIPAL_PERIOD", "%s: must be at least 1ms", c.PrincipalPeriod)
	v.Require(c.RedisTimeout >= time.Millisecond && c.RedisTimeout <= 5*time.Second, "FLOODGATE_LIMITER_REDIS_TIMEOUT", "%s: must be in 1ms..5s", c.RedisTimeout)
	v.Require(c.EventBuffer >= 1, "FLOODGATE_LIMITER_EVENT_BUFFER", "%d: must be at least 1", c.EventBuffer)
	v.Require(c.ShutdownTimeout > 0, "FLOODGATE_SHUTDOWN_TIMEOUT", "must be positive")
	return v.Err()
}
