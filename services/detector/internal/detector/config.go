package detector

import (
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/config/backends"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/series"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// ServiceConfig is the detector's start-up configuration, read from the environment.
type ServiceConfig struct {
	HTTPAddr        string           // FLOODGATE_DETECTOR_ADDR: /healthz, /readyz, /metrics
	SharedIPs       string           // FLOODGATE_DETECTOR_SHARED_IPS: redis (share per-address counts across instances) | off
	MaxEventSkew    time.Duration    // FLOODGATE_DETECTOR_MAX_EVENT_SKEW: events dated further in the future are dead-lettered
	MaxEventAge     time.Duration    // FLOODGATE_DETECTOR_MAX_EVENT_AGE: events older than this are dead-lettered
	MaxEventCost    int64            // FLOODGATE_EVENT_MAX_COST: events with a larger cost are dead-lettered
	DayQuotas       string           // FLOODGATE_EVENT_DAY_QUOTAS: kind=units, the largest daily quota of each kind
	DaySlack        int              // FLOODGATE_EVENT_DAY_SLACK: percent over DayQuotas an honest limiter may admit
	DayBounds       events.DayBounds // DayQuotas plus DaySlack: allowed units past it in a day are dead-lettered (issue 37)
	config.Backends                  // FLOODGATE_REDIS_*, FLOODGATE_KAFKA_*
	DecisionsTopic  string           // FLOODGATE_DECISIONS_TOPIC
	AbuseTopic      string           // FLOODGATE_ABUSE_TOPIC
	ParamsTopic     string           // FLOODGATE_DETECTOR_PARAMS_TOPIC: detector parameters versions (docs/detector.md); "" = the environment's alone
	Group           string           // FLOODGATE_DETECTOR_GROUP
	// StartOffset is where a new detector group starts on the decisions topic
	// (FLOODGATE_DETECTOR_START_OFFSET): "first" (default) scores the whole
	// retained history; "last" only live traffic, for a throwaway group.
	StartOffset     string
	PagerGroup      string // FLOODGATE_PAGER_GROUP
	Score           score.Config
	Mode            string // FLOODGATE_DETECTOR_MODE: enforce | simulate (default of every pattern)
	Policies        map[events.Pattern]PatternPolicy
	Ladder          Ladder // FLOODGATE_DETECTOR_LADDER_STEPS, FLOODGATE_DETECTOR_LADDER_FIRST_TTL
	Escalation      Escalation
	BlastLimit      int           // FLOODGATE_DETECTOR_BLAST_LIMIT: penalties per pattern per minute
	Records         string        // FLOODGATE_DETECTOR_RECORDS: dynamodb | off
	DynamoEndpoint  string        // FLOODGATE_DYNAMODB_ENDPOINT (unset = AWS)
	DynamoPrefix    string        // FLOODGATE_DYNAMODB_TABLE_PREFIX
	RecordRetention time.Duration // FLOODGATE_DETECTOR_RECORD_RETENTION
	AllowRefresh    time.Duration // FLOODGATE_DETECTOR_ALLOWLIST_REFRESH
	series.Influx                 // FLOODGATE_INFLUX_*
	PagerRoutingKey string        // FLOODGATE_PAGERDUTY_ROUTING_KEY; empty disables paging
	PagerURL        string        // FLOODGATE_PAGERDUTY_URL; empty means PagerDuty's Events API
	PagerSeverity   string        // FLOODGATE_PAGERDUTY_MIN_SEVERITY (critical = score ≥ 10)
	PagerPerMinute  int           // FLOODGATE_PAGERDUTY_MAX_PER_MINUTE
	PagerResolve    time.Duration // FLOODGATE_PAGERDUTY_RESOLVE_INTERVAL
}

// ServiceConfigFromEnv reads and validates the configuration.
func ServiceConfigFromEnv(getenv config.Getenv) (ServiceConfig, error) {
	e := config.NewEnv(getenv)
	def := score.DefaultConfig()
	c := ServiceConfig{
		HTTPAddr:       e.String("FLOODGATE_DETECTOR_ADDR", "127.0.0.1:8082"),
		Backends:       backends.Read(e),
		DecisionsTopic: e.String("FLOODGATE_DECISIONS_TOPIC", config.DefaultDecisionsTopic),
		AbuseTopic:     e.String("FLOODGATE_ABUSE_TOPIC", config.DefaultAbuseTopic),
		ParamsTopic:    e.String("FLOODGATE_DETECTOR_PARAMS_TOPIC", ""),
		Group:          e.String("FLOODGATE_DETECTOR_GROUP", "floodgate-detector"),
		PagerGroup:     e.String("FLOODGATE_PAGER_GROUP", "floodgate-pager"),
		StartOffset:    e.String("FLOODGATE_DETECTOR_START_OFFSET", "first"),
		Score: score.Config{
			Window:               e.Duration("FLOODGATE_DETECTOR_WINDOW", def.Window),
			Threshold:            e.Float("FLOODGATE_DETECTOR_RAPID_FIRE_THRESHOLD", def.Threshold),
			Floor:                e.Float("FLOODGATE_DETECTOR_RAPID_FIRE_RATE", def.Floor),
			BaselineK:            e.Float("FLOODGATE_DETECTOR_BASELINE_K", def.BaselineK),
			BaselineHalfLife:     e.Duration("FLOODGATE_DETECTOR_BASELINE_HALF_LIFE", def.BaselineHalfLife),
			RouteQuantile:        e.Float("FLOODGATE_DETECTOR_ROUTE_QUANTILE", def.RouteQuantile),
			RouteMinPrincipals:   e.Int("FLOODGATE_DETECTOR_ROUTE_MIN_PRINCIPALS", def.RouteMinPrincipals),
			Cooldown:             e.Duration("FLOODGATE_DETECTOR_COOLDOWN", def.Cooldown),
			IPWindow:             e.Duration("FLOODGATE_DETECTOR_IP_WINDOW", def.IPWindow),
			MinDistinctIPs:       e.Int("FLOODGATE_DETECTOR_IP_MIN_DISTINCT", def.MinDistinctIPs),
			MinDiversity:         e.Float("FLOODGATE_DETECTOR_IP_MIN_DIVERSITY", def.MinDiversity),
			SharedIPPrincipals:   e.Int("FLOODGATE_DETECTOR_SHARED_IP_PRINCIPALS", def.SharedIPPrincipals),
			BotLikeMinGaps:       e.Int("FLOODGATE_DETECTOR_BOT_LIKE_MIN_GAPS", def.BotLikeMinGaps),
			BotLikeMaxCV:         e.Float("FLOODGATE_DETECTOR_BOT_LIKE_MAX_CV", def.BotLikeMaxCV),
			BotLikeMaxMeanGap:    e.Duration("FLOODGATE_DETECTOR_BOT_LIKE_MAX_MEAN_GAP", def.BotLikeMaxMeanGap),
			AutomatedDenialRatio: e.Float("FLOODGATE_DETECTOR_AUTOMATED_DENIAL_RATIO", def.AutomatedDenialRatio),
			FanoutMinNetworks:    e.Int("FLOODGATE_DETECTOR_FANOUT_MIN_NETWORKS", def.FanoutMinNetworks),
			FanoutInterval:       e.Duration("FLOODGATE_DETECTOR_FANOUT_INTERVAL", def.FanoutInterval),
			PersonSustain:        e.Duration("FLOODGATE_DETECTOR_PERSON_SUSTAIN", def.PersonSustain),
			PersonMinDenials:     e.Int("FLOODGATE_DETECTOR_PERSON_MIN_DENIALS", def.PersonMinDenials),
			PersonDenialRatio:    e.Float("FLOODGATE_DETECTOR_PERSON_DENIAL_RATIO", def.PersonDenialRatio),
		},
		Mode: e.String("FLOODGATE_DETECTOR_MODE", "enforce"),
		Ladder: Ladder{
			Steps:    e.Int("FLOODGATE_DETECTOR_LADDER_STEPS", DefaultLadder().Steps),
			FirstTTL: e.Duration("FLOODGATE_DETECTOR_LADDER_FIRST_TTL", DefaultLadder().FirstTTL),
		},
		Escalation: Escalation{
			Lookback: e.Duration("FLOODGATE_DETECTOR_ESCALATION_LOOKBACK", 7*24*time.Hour),
			Quiet:    e.Duration("FLOODGATE_DETECTOR_INCIDENT_QUIET", 10*time.Minute),
			Factor:   e.Float("FLOODGATE_DETECTOR_ESCALATION_FACTOR", 2),
			MaxTTL:   e.Duration("FLOODGATE_DETECTOR_ESCALATION_MAX_TTL", 72*time.Hour),
			Jitter:   e.Float("FLOODGATE_DETECTOR_ESCALATION_JITTER", 0.1),
		},
		BlastLimit:      e.Int("FLOODGATE_DETECTOR_BLAST_LIMIT", 100),
		Records:         e.String("FLOODGATE_DETECTOR_RECORDS", "dynamodb"),
		SharedIPs:       e.String("FLOODGATE_DETECTOR_SHARED_IPS", "redis"),
		MaxEventSkew:    e.Duration("FLOODGATE_DETECTOR_MAX_EVENT_SKEW", 5*time.Minute),
		MaxEventAge:     e.Duration("FLOODGATE_DETECTOR_MAX_EVENT_AGE", 7*24*time.Hour),
		MaxEventCost:    int64(e.Int("FLOODGATE_EVENT_MAX_COST", events.DefaultMaxCost)),
		DayQuotas:       e.String("FLOODGATE_EVENT_DAY_QUOTAS", events.DefaultDayQuotas),
		DaySlack:        e.Int("FLOODGATE_EVENT_DAY_SLACK", events.DefaultDaySlackPercent),
		DynamoEndpoint:  e.String("FLOODGATE_DYNAMODB_ENDPOINT", ""),
		DynamoPrefix:    e.String("FLOODGATE_DYNAMODB_TABLE_PREFIX", ""),
		RecordRetention: e.Duration("FLOODGATE_DETECTOR_RECORD_RETENTION", 90*24*time.Hour),
		AllowRefresh:    e.Duration("FLOODGATE_DETECTOR_ALLOWLIST_REFRESH", 30*time.Second),
		Influx:          series.ReadInflux(e),
		PagerRoutingKey: e.String("FLOODGATE_PAGERDUTY_ROUTING_KEY", ""),
		PagerURL:        e.String("FLOODGATE_PAGERDUTY_URL", ""),
		PagerSeverity:   e.String("FLOODGATE_PAGERDUTY_MIN_SEVERITY", "critical"),
		PagerPerMinute:  e.Int("FLOODGATE_PAGERDUTY_MAX_PER_MINUTE", 10),
		PagerResolve:    e.Duration("FLOODGATE_PAGERDUTY_RESOLVE_INTERVAL", 30*time.Second),
	}
	c.Policies = map[events.Pattern]PatternPolicy{}
	for _, p := range []struct {
		pattern         events.Pattern
		env             string
		mult            float64
		ttl             time.Duration
		multEnv, ttlEnv string
	}{
		{score.RapidFire, "FLOODGATE_DETECTOR_RAPID_FIRE_MODE", 0.1, 30 * time.Minute, "FLOODGATE_DETECTOR_PENALTY_MULTIPLIER", "FLOODGATE_DETECTOR_PENALTY_TTL"},
		{score.DistributedIP, "FLOODGATE_DETECTOR_DISTRIBUTED_IP_MODE", 0.05, 6 * time.Hour, "FLOODGATE_DETECTOR_DISTRIBUTED_IP_MULTIPLIER", "FLOODGATE_DETECTOR_DISTRIBUTED_IP_TTL"},
		{score.BotLike, "FLOODGATE_DETECTOR_BOT_LIKE_MODE", 0.2, time.Hour, "FLOODGATE_DETECTOR_BOT_LIKE_MULTIPLIER", "FLOODGATE_DETECTOR_BOT_LIKE_TTL"},
	} {
		mode := e.String(p.env, c.Mode)
		c.Policies[p.pattern] = PatternPolicy{Multiplier: e.Float(p.multEnv, p.mult), TTL: e.Duration(p.ttlEnv, p.ttl), Enforce: mode == "enforce"}
		if mode != "enforce" && mode != "simulate" {
			var v config.Check
			v.Require(false, p.env, "%q is not one of enforce|simulate", mode)
			if err := v.Err(); err != nil {
				return ServiceConfig{}, err
			}
		}
	}
	c.DayBounds, _ = events.ParseDayBounds(c.DayQuotas, c.DaySlack) // an error is Validate's
	return config.Validated(c, e.Err())
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c ServiceConfig) Validate() error {
	var v config.Check
	v.Require(c.StartOffset == "first" || c.StartOffset == "last", "FLOODGATE_DETECTOR_START_OFFSET", "%q is not one of first|last", c.StartOffset)
	v.Require(len(c.RedisAddrs) > 0, "FLOODGATE_REDIS_ADDRS", "at least one host:port")
	v.Require(len(c.KafkaBrokers) > 0, "FLOODGATE_KAFKA_BROKERS", "at least one host:port")
	v.Require(c.DecisionsTopic != "" && c.AbuseTopic != "", "FLOODGATE_DECISIONS_TOPIC/FLOODGATE_ABUSE_TOPIC", "required")
	v.Require(c.Group != "" && c.PagerGroup != "" && c.Group != c.PagerGroup, "FLOODGATE_DETECTOR_GROUP/FLOODGATE_PAGER_GROUP", "two different, non-empty consumer groups")
	if err := c.Score.Validate(); err != nil {
		v.Require(false, "score", "%v", err)
	}
	if c.ParamsTopic != "" {
		err := rollout.ValidTopic(c.ParamsTopic)
		v.Require(err == nil, "FLOODGATE_DETECTOR_PARAMS_TOPIC", "%v", err)
	}
	v.Require(c.Mode == "enforce" || c.Mode == "simulate", "FLOODGATE_DETECTOR_MODE", "%q is not one of enforce|simulate", c.Mode)
	for pattern, p := range c.Policies {
		v.Require(p.Multiplier > 0 && p.Multiplier <= 1, "FLOODGATE_DETECTOR_*_MULTIPLIER", "%s: %g must be in (0, 1]", pattern, p.Multiplier)
		v.Require(p.TTL >= time.Second && p.TTL <= 30*24*time.Hour, "FLOODGATE_DETECTOR_*_TTL", "%s: %s must be in 1s..720h", pattern, p.TTL)
	}
	v.Require(c.Ladder.Steps >= 1 && c.Ladder.Steps <= 9, "FLOODGATE_DETECTOR_LADDER_STEPS", "%d: must be in 1..9", c.Ladder.Steps)
	v.Require(c.Ladder.FirstTTL >= time.Second && c.Ladder.FirstTTL <= time.Hour, "FLOODGATE_DETECTOR_LADDER_FIRST_TTL", "%s: must be in 1s..1h", c.Ladder.FirstTTL)
	v.Require(c.Escalation.Lookback >= 0, "FLOODGATE_DETECTOR_ESCALATION_LOOKBACK", "must not be negative")
	v.Require(c.Escalation.Quiet >= 0, "FLOODGATE_DETECTOR_INCIDENT_QUIET", "must not be negative")
	v.Require(c.Escalation.Factor >= 1 && c.Escalation.Factor <= 10, "FLOODGATE_DETECTOR_ESCALATION_FACTOR", "%g: must be in 1..10", c.Escalation.Factor)
	v.Require(c.Escalation.MaxTTL >= time.Second && c.Escalation.MaxTTL <= 30*24*time.Hour, "FLOODGATE_DETECTOR_ESCALATION_MAX_TTL", "%s: must be in 1s..720h", c.Escalation.MaxTTL)
	v.Require(c.Escalation.Jitter >= 0 && c.Escalation.Jitter < 0.5, "FLOODGATE_DETECTOR_ESCALATION_JITTER", "%g: must be in [0, 0.5)", c.Escalation.Jitter)
	v.Require(c.BlastLimit >= 1, "FLOODGATE_DETECTOR_BLAST_LIMIT", "%d: at least 1", c.BlastLimit)
	v.Require(c.Records == "dynamodb" || c.Records == "off", "FLOODGATE_DETECTOR_RECORDS", "%q is not one of dynamodb|off", c.Records)
	v.Require(c.SharedIPs == "redis" || c.SharedIPs == "off", "FLOODGATE_DETECTOR_SHARED_IPS", "%q is not one of redis|off", c.SharedIPs)
	v.Require(c.MaxEventSkew >= time.Second && c.MaxEventSkew <= 24*time.Hour, "FLOODGATE_DETECTOR_MAX_EVENT_SKEW", "%s: must be in 1s..24h", c.MaxEventSkew)
	v.Require(c.MaxEventAge >= c.Score.IPWindow, "FLOODGATE_DETECTOR_MAX_EVENT_AGE", "%s: must cover FLOODGATE_DETECTOR_IP_WINDOW (%s), which a restart re-reads", c.MaxEventAge, c.Score.IPWindow)
	v.Require(c.MaxEventCost >= 1 && c.MaxEventCost <= 1_000_000, "FLOODGATE_EVENT_MAX_COST",
		"%d: must be in 1..1000000 (at least the largest max_cost of the limiter's rules)", c.MaxEventCost)
	_, derr := events.ParseDayBounds(c.DayQuotas, 0)
	v.Require(derr == nil, "FLOODGATE_EVENT_DAY_QUOTAS", "%v (the largest daily quota of each kind in the limiter's rules; none for no bound)", derr)
	v.Require(c.DaySlack >= 0 && c.DaySlack <= 100, "FLOODGATE_EVENT_DAY_SLACK", "%d: must be in 0..100 (percent)", c.DaySlack)
	v.Require(c.RecordRetention >= 24*time.Hour, "FLOODGATE_DETECTOR_RECORD_RETENTION", "%s: at least 24h", c.RecordRetention)
	v.Require(c.RecordRetention >= c.Escalation.Lookback, "FLOODGATE_DETECTOR_RECORD_RETENTION", "must cover FLOODGATE_DETECTOR_ESCALATION_LOOKBACK")
	v.Require(c.AllowRefresh >= time.Second, "FLOODGATE_DETECTOR_ALLOWLIST_REFRESH", "at least 1s")
	v.Require(c.InfluxURL != "" && c.InfluxBucket != "", "FLOODGATE_INFLUX_URL/FLOODGATE_INFLUX_BUCKET", "required")
	_, sevOK := severityRank[events.Severity(c.PagerSeverity)]
	v.Require(sevOK, "FLOODGATE_PAGERDUTY_MIN_SEVERITY", "%q is not one of low|medium|high|critical", c.PagerSeverity)
	v.Require(c.PagerPerMinute >= 1, "FLOODGATE_PAGERDUTY_MAX_PER_MINUTE", "%d: at least 1", c.PagerPerMinute)
	v.Require(c.PagerResolve >= time.Second, "FLOODGATE_PAGERDUTY_RESOLVE_INTERVAL", "at least 1s")
	return v.Err()
}
