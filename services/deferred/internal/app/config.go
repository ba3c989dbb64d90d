package app

import (
	"errors"
	"net/url"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/config/backends"
	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Config is the worker's start-up configuration, read from the environment
// (docs/deferred.md lists every variable).
type Config struct {
	HTTPAddr        string // FLOODGATE_DEFERRED_ADDR: /healthz, /readyz, /metrics
	config.Backends        // FLOODGATE_REDIS_*, FLOODGATE_KAFKA_*
	Topic           string // FLOODGATE_DEFERRED_TOPIC
	Group           string // FLOODGATE_DEFERRED_GROUP

	Upstream        string        // FLOODGATE_DEFERRED_UPSTREAM: base URL the request path is appended to
	UpstreamTimeout time.Duration // FLOODGATE_DEFERRED_UPSTREAM_TIMEOUT: one attempt
	ServiceToken    config.Secret // FLOODGATE_DEFERRED_SERVICE_TOKEN(_FILE): the worker's bearer token at the upstream
	SigningKey      config.Secret // FLOODGATE_DEFERRED_SIGNING_KEY(_FILE): HMAC key of the principal header
	LimiterURL      string        // FLOODGATE_DEFERRED_LIMITER_URL
	LimiterToken    config.Secret // FLOODGATE_DEFERRED_LIMITER_TOKEN(_FILE)
	LimiterTimeout  time.Duration // FLOODGATE_DEFERRED_LIMITER_TIMEOUT

	ResultTTL     time.Duration // FLOODGATE_DEFERRED_RESULT_TTL
	ResultMaxBody int           // FLOODGATE_DEFERRED_RESULT_MAX_BODY
	ResultHeaders []string      // FLOODGATE_DEFERRED_RESULT_HEADERS
	MaxBackoff    time.Duration // FLOODGATE_DEFERRED_MAX_BACKOFF
	DrainTimeout  time.Duration // FLOODGATE_DEFERRED_DRAIN_TIMEOUT
	Door          stream.DoorLimits
}

// Defaults.
const (
	DefaultAddr  = "127.0.0.1:8087"
	DefaultGroup = "floodgate-deferred"
)

// ConfigFromEnv reads and validates the configuration.
func ConfigFromEnv(getenv config.Getenv) (Config, error) {
	e := config.NewEnv(getenv)
	c := Config{
		HTTPAddr:        e.String("FLOODGATE_DEFERRED_ADDR", DefaultAddr),
		Backends:        backends.Read(e),
		Topic:           e.String("FLOODGATE_DEFERRED_TOPIC", deferred.DefaultTopic),
		Group:           e.String("FLOODGATE_DEFERRED_GROUP", DefaultGroup),
		Upstream:        e.String("FLOODGATE_DEFERRED_UPSTREAM", ""),
		UpstreamTimeout: e.Duration("FLOODGATE_DEFERRED_UPSTREAM_TIMEOUT", 10*time.Second),
		ServiceToken:    e.Secret("FLOODGATE_DEFERRED_SERVICE_TOKEN", "FLOODGATE_DEFERRED_SERVICE_TOKEN_FILE"),
		SigningKey:      e.Secret("FLOODGATE_DEFERRED_SIGNING_KEY", "FLOODGATE_DEFERRED_SIGNING_KEY_FILE"),
		LimiterURL:      e.String("FLOODGATE_DEFERRED_LIMITER_URL", "http://127.0.0.1:8080"),
		LimiterToken:    e.Secret("FLOODGATE_DEFERRED_LIMITER_TOKEN", "FLOODGATE_DEFERRED_LIMITER_TOKEN_FILE"),
		LimiterTimeout:  e.Duration("FLOODGATE_DEFERRED_LIMITER_TIMEOUT", time.Second),
		ResultTTL:       e.Duration("FLOODGATE_DEFERRED_RESULT_TTL", 24*time.Hour),
		ResultMaxBody:   e.Int("FLOODGATE_DEFERRED_RESULT_MAX_BODY", 64<<10),
		ResultHeaders:   e.List("FLOODGATE_DEFERRED_RESULT_HEADERS", "Content-Type,Location,ETag"),
		MaxBackoff:      e.Duration("FLOODGATE_DEFERRED_MAX_BACKOFF", 5*time.Second),
		DrainTimeout:    e.Duration("FLOODGATE_DEFERRED_DRAIN_TIMEOUT", 10*time.Second),
		Door:            stream.ReadDoorLimits(e),
	}
	return config.Validated(c, e.Err())
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c Config) Validate() error {
	var v config.Check
	v.Require(c.HTTPAddr != "", "FLOODGATE_DEFERRED_ADDR", "required (host:port)")
	v.Require(len(c.KafkaBrokers) > 0, "FLOODGATE_KAFKA_BROKERS", "at least one host:port")
	v.Require(events.ValidTopic(c.Topic) == nil, "FLOODGATE_DEFERRED_TOPIC", "%q: a Kafka topic name", c.Topic)
	v.Require(c.Group != "", "FLOODGATE_DEFERRED_GROUP", "required")
	v.Require(len(c.RedisAddrs) > 0, "FLOODGATE_REDIS_ADDRS", "at least one host:port")
	v.Require(validBaseURL(c.Upstream), "FLOODGATE_DEFERRED_UPSTREAM", "%q: required, an http or https URL without query (the request path is appended)", c.Upstream)
	v.Require(validBaseURL(c.LimiterURL), "FLOODGATE_DEFERRED_LIMITER_URL", "%q: an http or https URL", c.LimiterURL)
	v.Require(c.UpstreamTimeout >= 10*time.Millisecond && c.UpstreamTimeout <= 5*time.Minute, "FLOODGATE_DEFERRED_UPSTREAM_TIMEOUT", "%s: must be in 10ms..5m", c.UpstreamTimeout)
	v.Require(c.LimiterTimeout >= time.Millisecond && c.LimiterTimeout <= time.Minute, "FLOODGATE_DEFERRED_LIMITER_TIMEOUT", "%s: must be in 1ms..1m", c.LimiterTimeout)
	v.Require(len(c.SigningKey.Reveal()) >= 32, "FLOODGATE_DEFERRED_SIGNING_KEY", "required, at least 32 bytes: upstreams verify the principal header with it")
	v.Require(c.ResultTTL >= time.Minute && c.ResultTTL <= 30*24*time.Hour, "FLOODGATE_DEFERRED_RESULT_TTL", "%s: must be in 1m..720h", c.ResultTTL)
	v.Require(c.ResultMaxBody >= 0 && c.ResultMaxBody <= 1<<20, "FLOODGATE_DEFERRED_RESULT_MAX_BODY", "%d: must be in 0..1048576 bytes", c.ResultMaxBody)
	v.Require(c.MaxBackoff >= 10*time.Millisecond && c.MaxBackoff <= 5*time.Minute, "FLOODGATE_DEFERRED_MAX_BACKOFF", "%s: must be in 10ms..5m", c.MaxBackoff)
	v.Require(c.DrainTimeout >= time.Second && c.DrainTimeout <= 5*time.Minute, "FLOODGATE_DEFERRED_DRAIN_TIMEOUT", "%s: must be in 1s..5m", c.DrainTimeout)
	for _, h := range c.ResultHeaders {
		v.Require(h != "" && !strings.ContainsAny(h, " :\t"), "FLOODGATE_DEFERRED_RESULT_HEADERS", "%q: not a header name", h)
		v.Require(!strings.EqualFold(h, "Set-Cookie"), "FLOODGATE_DEFERRED_RESULT_HEADERS", "Set-Cookie is never kept for a replayed request")
	}
	return errors.Join(v.Err(), c.Door.Validate())
}

func validBaseURL(s string) bool {
	u, err := url.Parse(s)
	return err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "" && u.RawQuery == "" && u.Fragment == ""
}
