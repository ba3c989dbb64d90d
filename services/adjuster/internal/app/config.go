package app

import (
	"errors"
	"fmt"
	"os"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/config/backends"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/series"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/admin"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/signals"
)

// DefaultParamsMaxLost is the share of its parent's penalized decisions a
// detector parameters candidate may stop penalizing
// (FLOODGATE_ADJUSTER_PARAMS_MAX_LOST, docs/detector.md).
const DefaultParamsMaxLost = 0.1

// Config is the adjuster's start-up configuration, read from the environment.
type Config struct {
	HTTPAddr          string            // FLOODGATE_ADJUSTER_ADDR: admin API, /healthz, /readyz, /metrics
	RulesFile         string            // FLOODGATE_ADJUSTER_RULES: YAML rules; empty = built-in defaults (= adjuster.yaml)
	Rules             control.Rules     // parsed from RulesFile
	Tokens            *httpapi.Tokens   // FLOODGATE_ADJUSTER_TOKENS(_FILE): a token spec, name:role:sha256hex,…
	ActorID           string            // FLOODGATE_ADJUSTER_ID: names this loop in adjustment events
	config.Backends                     // FLOODGATE_REDIS_*, FLOODGATE_KAFKA_*
	ScalesKey         string            // FLOODGATE_ADJUSTER_SCALES_KEY (tests only; default fg:scales)
	ShedKey           string            // FLOODGATE_ADJUSTER_SHED_KEY (tests only; default fg:shed)
	AdjustmentsTopic  string            // FLOODGATE_ADJUSTMENTS_TOPIC
	RulesTopic        string            // FLOODGATE_RULES_TOPIC: the rollout controller watches it (docs/rollouts.md); "" = off
	ParamsTopic       string            // FLOODGATE_DETECTOR_PARAMS_TOPIC: detector parameters rollouts, watched by a second controller (docs/detector.md); "" = off
	RolloutWindow     time.Duration     // FLOODGATE_ADJUSTER_ROLLOUT_WINDOW: the controller's recent window (default 5m; 0 = cumulative only)
	RolloutGate       rollout.ClassGate // FLOODGATE_ADJUSTER_ROLLOUT_CLASS_LIMITS, FLOODGATE_ADJUSTER_ROLLOUT_MIN_CLASS (docs/rollouts.md)
	ParamsMaxLost     float64           // FLOODGATE_ADJUSTER_PARAMS_MAX_LOST: the parameters controller's lost gate (ClassGate.MaxLost; 0 = off)
	ParamsMinLost     int64             // FLOODGATE_ADJUSTER_PARAMS_MIN_LOST: ClassGate.MinLost
	DynamoEndpoint    string            // FLOODGATE_DYNAMODB_ENDPOINT (empty = AWS)
	DynamoTablePrefix string            // FLOODGATE_DYNAMODB_TABLE_PREFIX
	series.Influx                       // FLOODGATE_INFLUX_*
	Filters           signals.Filters   // FLOODGATE_ADJUSTER_{HOST,HTTP,ABUSE,DECISION}_TAGS (see signalFilters)
	PagerRoutingKey   string            // FLOODGATE_PAGERDUTY_ROUTING_KEY; empty disables paging
	PagerURL          string            // FLOODGATE_PAGERDUTY_URL
}

// ConfigFromEnv reads and validates the configuration.
func ConfigFromEnv(getenv config.Getenv) (Config, error) {
	e := config.NewEnv(getenv)
	host, _ := os.Hostname()
	c := Config{
		HTTPAddr:          e.String("FLOODGATE_ADJUSTER_ADDR", "127.0.0.1:8083"),
		RulesFile:         e.String("FLOODGATE_ADJUSTER_RULES", ""),
		ActorID:           e.String("FLOODGATE_ADJUSTER_ID", "adjuster@"+host),
		Backends:          backends.Read(e),
		ScalesKey:         e.String("FLOODGATE_ADJUSTER_SCALES_KEY", redisx.ScalesKey),
		ShedKey:           e.String("FLOODGATE_ADJUSTER_SHED_KEY", redisx.ShedKey),
		AdjustmentsTopic:  e.String("FLOODGATE_ADJUSTMENTS_TOPIC", config.DefaultAdjustmentsTopic),
		RulesTopic:        e.String("FLOODGATE_RULES_TOPIC", ""),
		ParamsTopic:       e.String("FLOODGATE_DETECTOR_PARAMS_TOPIC", ""),
		RolloutWindow:     e.Duration("FLOODGATE_ADJUSTER_ROLLOUT_WINDOW", rollout.DefaultWindow),
		DynamoEndpoint:    e.String("FLOODGATE_DYNAMODB_ENDPOINT", ""),
		DynamoTablePrefix: e.String("FLOODGATE_DYNAMODB_TABLE_PREFIX", ""),
		Influx:            series.ReadInflux(e),
		PagerRoutingKey:   e.String("FLOODGATE_PAGERDUTY_ROUTING_KEY", ""),
		PagerURL:          e.String("FLOODGATE_PAGERDUTY_URL", ""),
	}
	var v config.Check
	var err error
	c.Filters, err = signalFilters(e)
	v.Require(err == nil, "FLOODGATE_ADJUSTER_*_TAGS", "%v", err)
	c.RolloutGate.Limits, err = rollout.ParseClassLimits(e.String("FLOODGATE_ADJUSTER_ROLLOUT_CLASS_LIMITS", ""))
	v.Require(err == nil, "FLOODGATE_ADJUSTER_ROLLOUT_CLASS_LIMITS", "%v", err)
	c.RolloutGate.MinClass = int64(e.Int("FLOODGATE_ADJUSTER_ROLLOUT_MIN_CLASS", rollout.DefaultMinClass))
	v.Require(c.RolloutGate.MinClass >= 1, "FLOODGATE_ADJUSTER_ROLLOUT_MIN_CLASS", "%d: at least 1", c.RolloutGate.MinClass)
	c.ParamsMaxLost = e.Float("FLOODGATE_ADJUSTER_PARAMS_MAX_LOST", DefaultParamsMaxLost)
	v.Require(c.ParamsMaxLost >= 0 && c.ParamsMaxLost < 1, "FLOODGATE_ADJUSTER_PARAMS_MAX_LOST", "%g: a share in [0, 1) (0.1 = 10 %%; 0 = off)", c.ParamsMaxLost)
	c.ParamsMinLost = int64(e.Int("FLOODGATE_ADJUSTER_PARAMS_MIN_LOST", rollout.DefaultMinLost))
	v.Require(c.ParamsMinLost >= 1, "FLOODGATE_ADJUSTER_PARAMS_MIN_LOST", "%d: at least 1", c.ParamsMinLost)
	c.Tokens, err = admin.ParseTokens(e.Secret("FLOODGATE_ADJUSTER_TOKENS", "FLOODGATE_ADJUSTER_TOKENS_FILE").Reveal())
	v.Require(err == nil, "FLOODGATE_ADJUSTER_TOKENS", "%v", err)
	c.Rules = control.Defaults()
	if c.RulesFile != "" {
		data, err := os.ReadFile(c.RulesFile)
		if err == nil {
			c.Rules, err = control.ParseRules(data)
		}
		v.Require(err == nil, "FLOODGATE_ADJUSTER_RULES", "%s: %v", c.RulesFile, err)
	}
	return config.Validated(c, e.Err(), v.Err())
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c Config) Validate() error {
	var v config.Check
	v.Require(c.HTTPAddr != "", "FLOODGATE_ADJUSTER_ADDR", "required (host:port)")
	v.Require(len(c.RedisAddrs) > 0, "FLOODGATE_REDIS_ADDRS", "at least one host:port")
	v.Require(c.ScalesKey != "", "FLOODGATE_ADJUSTER_SCALES_KEY", "must not be empty")
	v.Require(c.ShedKey != "", "FLOODGATE_ADJUSTER_SHED_KEY", "must not be empty")
	v.Require(len(c.KafkaBrokers) > 0, "FLOODGATE_KAFKA_BROKERS", "at least one host:port")
	v.Require(c.AdjustmentsTopic != "", "FLOODGATE_ADJUSTMENTS_TOPIC", "required")
	if c.RulesTopic != "" || c.ParamsTopic != "" {
		err := rollout.ValidWindow(c.RolloutWindow)
		v.Require(err == nil, "FLOODGATE_ADJUSTER_ROLLOUT_WINDOW", "%v", err)
	}
	if c.RulesTopic != "" {
		err := rollout.ValidTopic(c.RulesTopic)
		v.Require(err == nil, "FLOODGATE_RULES_TOPIC", "%v", err)
	}
	if c.ParamsTopic != "" {
		err := rollout.ValidTopic(c.ParamsTopic)
		v.Require(err == nil, "FLOODGATE_DETECTOR_PARAMS_TOPIC", "%v", err)
		v.Require(c.ParamsTopic != c.RulesTopic, "FLOODGATE_DETECTOR_PARAMS_TOPIC", "%q is the rules topic", c.ParamsTopic)
	}
	v.Require(c.InfluxURL != "" && c.InfluxBucket != "", "FLOODGATE_INFLUX_URL/FLOODGATE_INFLUX_BUCKET", "required")
	v.Require(c.ActorID != "" && len(c.ActorID) <= 128, "FLOODGATE_ADJUSTER_ID", "1-128 characters")
	v.Require(c.Rules.Validate() == nil, "FLOODGATE_ADJUSTER_RULES", "%v", c.Rules.Validate())
	return v.Err()
}

// parseTags reads "k=v,k2=v2".
func parseTags(s string) (map[string]string, error) {
	out := map[string]string{}
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		k, val, ok := strings.Cut(item, "=")
		if !ok || k == "" || val == "" {
			return nil, fmt.Errorf("%q: want tag=value", item)
		}
		out[k] = val
	}
	return out, nil
}

// signalFilters reads the tag filters that narrow each signal to one fleet, as
// k=v,… lists: FLOODGATE_ADJUSTER_HOST_TAGS (cpu, mem), _HTTP_TAGS
// (http_responses), _ABUSE_TAGS (abuse_detections) and _DECISION_TAGS
// (limiter_decisions, e.g. gateway=edge-eu).
func signalFilters(e *config.Env) (signals.Filters, error) {
	var f signals.Filters
	var errs []error
	for _, t := range []struct {
		env string
		dst *map[string]string
	}{
		{"FLOODGATE_ADJUSTER_HOST_TAGS", &f.Hosts}, {"FLOODGATE_ADJUSTER_HTTP_TAGS", &f.HTTP},
		{"FLOODGATE_ADJUSTER_ABUSE_TAGS", &f.Abuse}, {"FLOODGATE_ADJUSTER_DECISION_TAGS", &f.Decisions},
	} {
		m, err := parseTags(e.String(t.env, ""))
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %w", t.env, err))
		}
		*t.dst = m
	}
	return f, errors.Join(errs...)
}
