// Package app wires the console: configuration, clients, the HTTP server and
// the user/token subcommands.
package app

import (
	"bufio"
	"context"
	"crypto/rand"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/precision"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/series"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/blockrate"
	"github.com/floodgate-dev/floodgate/services/console/internal/dlq"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
	"github.com/floodgate-dev/floodgate/services/console/internal/web"
)

// Config is the console's configuration, read from the environment.
type Config struct {
	Addr          string               // FLOODGATE_CONSOLE_ADDR
	UsersFile     string               // FLOODGATE_CONSOLE_USERS (re-read every 2 s when it changes)
	SessionSecret string               // FLOODGATE_CONSOLE_SESSION_SECRET: ≥ 32 bytes, the same on every replica; never in Redis
	SecureCookies bool                 // FLOODGATE_CONSOLE_SECURE_COOKIES
	SessionIdle   time.Duration        // FLOODGATE_CONSOLE_SESSION_IDLE
	SessionMax    time.Duration        // FLOODGATE_CONSOLE_SESSION_MAX
	PollInterval  time.Duration        // FLOODGATE_CONSOLE_POLL_INTERVAL
	RedisAddrs    []string             // FLOODGATE_REDIS_ADDRS
	RedisSecurity config.RedisSecurity // FLOODGATE_REDIS_USERNAME, FLOODGATE_REDIS_PASSWORD, FLOODGATE_REDIS_TLS*
	DynamoDB      dynamo.Options
	ScalesKey     string // FLOODGATE_CONSOLE_SCALES_KEY
	QuotaURL      string // FLOODGATE_CONSOLE_QUOTA_URL
	AdjusterURL   string // FLOODGATE_CONSOLE_ADJUSTER_URL
	AdjusterToken string // FLOODGATE_CONSOLE_ADJUSTER_TOKEN
	QuotaToken    string // FLOODGATE_CONSOLE_QUOTA_TOKEN: a reader token of the quota usage API
	DLQURL        string // FLOODGATE_CONSOLE_DLQ_URL
	DLQToken      string // FLOODGATE_CONSOLE_DLQ_TOKEN
	series.Influx        // FLOODGATE_INFLUX_*

	KafkaBrokers   []string             // FLOODGATE_KAFKA_BROKERS (sample events on the alert page)
	KafkaSecurity  config.KafkaSecurity // FLOODGATE_KAFKA_TLS*, FLOODGATE_KAFKA_SASL_* (docs/configuration.md)
	DecisionsTopic string               // FLOODGATE_DECISIONS_TOPIC
	SamplesTimeout time.Duration        // FLOODGATE_CONSOLE_SAMPLES_TIMEOUT
	TrustedProxies []string             // FLOODGATE_CONSOLE_TRUSTED_PROXIES (whose X-Forwarded-For the sign-in limits believe)

	AdjustmentsTopic string        // FLOODGATE_ADJUSTMENTS_TOPIC (scale changes and their causes on the scales page)
	OverridesKey     string        // FLOODGATE_CONSOLE_OVERRIDES_KEY (the limiter's overrides hash)
	OverrideSweep    time.Duration // FLOODGATE_CONSOLE_OVERRIDE_SWEEP (how often expired overrides are removed)
	WhatIfMaxEvents  int           // FLOODGATE_CONSOLE_WHATIF_MAX_EVENTS (decisions one what-if run may replay; 0 turns the page off)
	RulesTopic       string        // FLOODGATE_RULES_TOPIC (the rule rollouts page; "" = not configured)
	ParamsTopic      string        // FLOODGATE_DETECTOR_PARAMS_TOPIC (the tuning proposals page; "" = not configured)

	VerdictsTopic       string        // FLOODGATE_VERDICTS_TOPIC (verdict.v1 events of reviewers' verdicts)
	DatacenterRanges    []string      // FLOODGATE_CONSOLE_DATACENTER_RANGES (CIDRs of hosting providers, for precision by network class)
	PrecisionThresholds string        // FLOODGATE_CONSOLE_PRECISION_THRESHOLDS ("0.95,rapid_fire=0.99": default and per pattern)
	PrecisionMinJudged  int           // FLOODGATE_CONSOLE_PRECISION_MIN_JUDGED (judged verdicts before a threshold is checked)
	PrecisionWindow     time.Duration // FLOODGATE_CONSOLE_PRECISION_WINDOW (the detections the metrics and thresholds judge)
}

// ConfigFromEnv reads and validates the configuration.
func ConfigFromEnv(getenv config.Getenv) (Config, error) {
	e := config.NewEnv(getenv)
	c := Config{
		Addr:          e.String("FLOODGATE_CONSOLE_ADDR", "127.0.0.1:8090"),
		UsersFile:     e.String("FLOODGATE_CONSOLE_USERS", ""),
		SessionSecret: e.String("FLOODGATE_CONSOLE_SESSION_SECRET", ""),
		SecureCookies: e.Bool("FLOODGATE_CONSOLE_SECURE_COOKIES", false),
		SessionIdle:   e.Duration("FLOODGATE_CONSOLE_SESSION_IDLE", 30*time.Minute),
		SessionMax:    e.Duration("FLOODGATE_CONSOLE_SESSION_MAX", 12*time.Hour),
		PollInterval:  e.Duration("FLOODGATE_CONSOLE_POLL_INTERVAL", 5*time.Second),
		RedisAddrs:    e.List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs),
		RedisSecurity: config.ReadRedisSecurity(e),
		DynamoDB: dynamo.Options{
			Endpoint:    e.String("FLOODGATE_DYNAMODB_ENDPOINT", ""),
			Region:      e.String("FLOODGATE_DYNAMODB_REGION", ""),
			TablePrefix: e.String("FLOODGATE_DYNAMODB_TABLE_PREFIX", ""),
		},
		ScalesKey:     e.String("FLOODGATE_CONSOLE_SCALES_KEY", redisx.ScalesKey),
		QuotaURL:      e.String("FLOODGATE_CONSOLE_QUOTA_URL", "http://127.0.0.1:8085"),
		AdjusterURL:   e.String("FLOODGATE_CONSOLE_ADJUSTER_URL", "http://127.0.0.1:8083"),
		AdjusterToken: e.String("FLOODGATE_CONSOLE_ADJUSTER_TOKEN", ""),
		QuotaToken:    e.String("FLOODGATE_CONSOLE_QUOTA_TOKEN", ""),
		DLQURL:        e.String("FLOODGATE_CONSOLE_DLQ_URL", "http://127.0.0.1:8084"),
		DLQToken:      e.String("FLOODGATE_CONSOLE_DLQ_TOKEN", ""),
		Influx:        series.ReadInflux(e),

		KafkaBrokers:   e.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers),
		KafkaSecurity:  config.ReadKafkaSecurity(e),
		DecisionsTopic: e.String("FLOODGATE_DECISIONS_TOPIC", config.DefaultDecisionsTopic),
		SamplesTimeout: e.Duration("FLOODGATE_CONSOLE_SAMPLES_TIMEOUT", 3*time.Second),
		TrustedProxies: e.List("FLOODGATE_CONSOLE_TRUSTED_PROXIES", ""),

		AdjustmentsTopic: e.String("FLOODGATE_ADJUSTMENTS_TOPIC", config.DefaultAdjustmentsTopic),
		RulesTopic:       e.String("FLOODGATE_RULES_TOPIC", ""),
		ParamsTopic:      e.String("FLOODGATE_DETECTOR_PARAMS_TOPIC", ""),
		OverridesKey:     e.String("FLOODGATE_CONSOLE_OVERRIDES_KEY", limiter.OverridesKey),
		OverrideSweep:    e.Duration("FLOODGATE_CONSOLE_OVERRIDE_SWEEP", 30*time.Second),
		WhatIfMaxEvents:  e.Int("FLOODGATE_CONSOLE_WHATIF_MAX_EVENTS", 200_000),

		VerdictsTopic:       e.String("FLOODGATE_VERDICTS_TOPIC", config.DefaultVerdictsTopic),
		DatacenterRanges:    e.List("FLOODGATE_CONSOLE_DATACENTER_RANGES", ""),
		PrecisionThresholds: e.String("FLOODGATE_CONSOLE_PRECISION_THRESHOLDS", "0.95"),
		PrecisionMinJudged:  e.Int("FLOODGATE_CONSOLE_PRECISION_MIN_JUDGED", 20),
		PrecisionWindow:     e.Duration("FLOODGATE_CONSOLE_PRECISION_WINDOW", 7*24*time.Hour),
	}
	return config.Validated(c, e.Err())
}

// Validate checks the fields and how they relate.
func (c Config) Validate() error {
	var errs []error
	if _, _, err := net.SplitHostPort(c.Addr); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_ADDR: %q is not host:port", c.Addr))
	}
	if strings.Contains(c.SessionSecret, "CHANGE-ME") {
		errs = append(errs, errors.New("FLOODGATE_CONSOLE_SESSION_SECRET: still the CHANGE-ME placeholder of the manifests; set a random secret (`openssl rand -hex 32`)"))
	} else if c.SessionSecret != "" && len(c.SessionSecret) < auth.MinSessionSecret {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_SESSION_SECRET: %d bytes, at least %d (e.g. `openssl rand -hex 32`)", len(c.SessionSecret), auth.MinSessionSecret))
	}
	if c.SessionSecret == "" && c.SecureCookies {
		errs = append(errs, errors.New("FLOODGATE_CONSOLE_SESSION_SECRET: required with FLOODGATE_CONSOLE_SECURE_COOKIES (production): sessions must survive restarts and be valid on every replica"))
	}
	if c.UsersFile == "" {
		errs = append(errs, errors.New("FLOODGATE_CONSOLE_USERS: set it to the users file (make entries with `console user add NAME ROLE`)"))
	}
	if c.SessionIdle < time.Minute || c.SessionIdle > 24*time.Hour {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_SESSION_IDLE: %s not in 1m..24h", c.SessionIdle))
	}
	if c.SessionMax < c.SessionIdle || c.SessionMax > 7*24*time.Hour {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_SESSION_MAX: %s must be at least FLOODGATE_CONSOLE_SESSION_IDLE (%s) and at most 168h", c.SessionMax, c.SessionIdle))
	}
	if c.PollInterval < time.Second || c.PollInterval > 5*time.Minute {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_POLL_INTERVAL: %s not in 1s..5m", c.PollInterval))
	}
	if len(c.RedisAddrs) == 0 {
		errs = append(errs, errors.New("FLOODGATE_REDIS_ADDRS: empty"))
	}
	if _, err := adjuster.New(c.AdjusterURL, c.AdjusterToken, nil); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_ADJUSTER_URL: %w", err))
	}
	if _, err := dlq.New(c.DLQURL, c.DLQToken, nil); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_DLQ_URL: %w", err))
	}
	if _, err := quota.New(c.QuotaURL, c.QuotaToken, nil); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_QUOTA_URL: %w", err))
	}
	if len(c.KafkaBrokers) == 0 {
		errs = append(errs, errors.New("FLOODGATE_KAFKA_BROKERS: empty"))
	}
	if err := events.ValidTopic(c.DecisionsTopic); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_DECISIONS_TOPIC: %w", err))
	}
	if c.SamplesTimeout < 100*time.Millisecond || c.SamplesTimeout > 30*time.Second {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_SAMPLES_TIMEOUT: %s not in 100ms..30s", c.SamplesTimeout))
	}
	if _, err := gateway.ParseTrustedProxies(c.TrustedProxies); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_TRUSTED_PROXIES: %w", err))
	}
	if err := events.ValidTopic(c.AdjustmentsTopic); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_ADJUSTMENTS_TOPIC: %w", err))
	}
	if c.OverridesKey == "" {
		errs = append(errs, errors.New("FLOODGATE_CONSOLE_OVERRIDES_KEY: empty"))
	}
	if c.WhatIfMaxEvents < 0 || c.WhatIfMaxEvents > 1_000_000 {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_WHATIF_MAX_EVENTS: %d not in 0..1000000 (0 turns the what-if page off; larger ranges: `limiter whatif`)", c.WhatIfMaxEvents))
	}
	if c.RulesTopic != "" {
		if err := rollout.ValidTopic(c.RulesTopic); err != nil {
			errs = append(errs, fmt.Errorf("FLOODGATE_RULES_TOPIC: %w", err))
		}
	}
	if c.ParamsTopic != "" {
		if err := rollout.ValidTopic(c.ParamsTopic); err != nil {
			errs = append(errs, fmt.Errorf("FLOODGATE_DETECTOR_PARAMS_TOPIC: %w", err))
		} else if c.ParamsTopic == c.RulesTopic {
			errs = append(errs, fmt.Errorf("FLOODGATE_DETECTOR_PARAMS_TOPIC: %q is the rules topic", c.ParamsTopic))
		}
	}
	if c.OverrideSweep < time.Second || c.OverrideSweep > 10*time.Minute {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_OVERRIDE_SWEEP: %s not in 1s..10m", c.OverrideSweep))
	}
	if err := events.ValidTopic(c.VerdictsTopic); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_VERDICTS_TOPIC: %w", err))
	}
	if _, err := precision.ParsePrefixes(c.DatacenterRanges); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_DATACENTER_RANGES: %w", err))
	}
	if _, err := precision.ParseThresholds(c.PrecisionThresholds); err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_PRECISION_THRESHOLDS: %w", err))
	}
	if c.PrecisionMinJudged < 1 || c.PrecisionMinJudged > 1_000_000 {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_PRECISION_MIN_JUDGED: %d not in 1..1000000", c.PrecisionMinJudged))
	}
	if c.PrecisionWindow < time.Hour || c.PrecisionWindow > store.MaxDays*24*time.Hour {
		errs = append(errs, fmt.Errorf("FLOODGATE_CONSOLE_PRECISION_WINDOW: %s not in 1h..744h", c.PrecisionWindow))
	}
	return errors.Join(errs...)
}

// precisionConfig is the web server's precision settings (validated).
func (c Config) precisionConfig() (precision.Classifier, web.PrecisionConfig) {
	dc, _ := precision.ParsePrefixes(c.DatacenterRanges)
	th, _ := precision.ParseThresholds(c.PrecisionThresholds)
	th.MinJudged = int64(c.PrecisionMinJudged)
	return precision.Classifier{Datacenter: dc}, web.PrecisionConfig{Window: c.PrecisionWindow, Thresholds: th}
}

// Run runs the subcommand in env.Args: none or "serve" serves; "user add
// NAME ROLE" and "token add NAME ROLE" print users-file entries.
func Run(ctx context.Context, env service.Env) error {
	args := env.Args
	switch {
	case len(args) == 0 || (len(args) == 1 && args[0] == "serve"):
		return Serve(ctx, env)
	case len(args) == 4 && args[0] == "user" && args[1] == "add":
		return userAdd(args[2], args[3], env.Stdin, env.Stdout)
	case len(args) == 4 && args[0] == "token" && args[1] == "add":
		return tokenAdd(args[2], args[3], env.Stdout)
	}
	return fmt.Errorf("usage: console [serve] | console user add NAME ROLE | console token add NAME ROLE (got %q)", strings.Join(args, " "))
}

// WhatIfTimeout bounds one what-if run of the SRE page: under the 30 s write
// timeout of ServerDefaults, so its report still reaches the browser.
const WhatIfTimeout = 25 * time.Second

// ServerDefaults are the console's HTTP limits unless FLOODGATE_HTTP_* says
// otherwise: pages and their forms need less than the API default write time.
func ServerDefaults() httpapi.ServerConfig {
	sc := httpapi.DefaultServerConfig()
	sc.WriteTimeout, sc.IdleTimeout = 30*time.Second, 2*time.Minute
	return sc
}

func userAdd(name, roleName string, stdin io.Reader, stdout io.Writer) error {
	role, err := auth.ParseRole(roleName)
	if err != nil {
		return err
	}
	if !auth.ValidName(name) {
		return fmt.Errorf("user name %q: 1-64 of [A-Za-z0-9._@-]", name)
	}
	line, err := bufio.NewReader(stdin).ReadString('\n')
	if err != nil && !errors.Is(err, io.EOF) {
		return fmt.Errorf("read password from stdin: %w", err)
	}
	hash, err := auth.HashPassword(strings.TrimRight(line, "\r\n"))
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "# add under users: in the users file\n%s\n", auth.UserLine(name, role, hash))
	return err
}

func tokenAdd(name, roleName string, stdout io.Writer) error {
	role, err := auth.ParseRole(roleName)
	if err != nil {
		return err
	}
	if !auth.ValidName(name) {
		return fmt.Errorf("token name %q: 1-64 of [A-Za-z0-9._@-]", name)
	}
	token, sum, err := auth.NewToken()
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "token (shown once; send as Authorization: Bearer): %s\n# add under tokens: in the users file\n%s\n", token, auth.TokenLine(name, role, sum))
	return err
}

// remotes are the console's clients of the other services' APIs. Without
// its token the adjuster's or the dlq-auditor's is nil: its page says so.
type remotes struct {
	quota    *quota.Client
	adjuster *adjuster.Client
	dlq      *dlq.Client
}

func newRemotes(cfg Config, log *slog.Logger) (r remotes, err error) {
	if r.quota, err = quota.New(cfg.QuotaURL, cfg.QuotaToken, nil); err != nil {
		return r, err
	}
	if r.adjuster, err = optional(log, cfg.AdjusterURL, cfg.AdjusterToken, adjuster.New,
		"FLOODGATE_CONSOLE_ADJUSTER_TOKEN is not set: the adjuster page says so and offers no change"); err != nil {
		return r, err
	}
	r.dlq, err = optional(log, cfg.DLQURL, cfg.DLQToken, dlq.New,
		"FLOODGATE_CONSOLE_DLQ_TOKEN is not set: the dead-letters page says so and offers no replay")
	return r, err
}

// optional is newClient(url, token) when token is set; without one it is
// nil, and unset is logged as a warning.
func optional[C any](log *slog.Logger, url, token string, newClient func(url, token string, hc *http.Client) (*C, error), unset string) (*C, error) {
	if token == "" {
		log.Warn(unset)
		return nil, nil
	}
	return newClient(url, token, nil)
}

// Serve serves the console until ctx is done.
func Serve(ctx context.Context, env service.Env) error {
	log := env.Log
	cfg, run, err := service.Start(env, ConfigFromEnv, ServerDefaults())
	if err != nil {
		return err
	}
	dir, err := auth.LoadReloading(cfg.UsersFile, log)
	if err != nil {
		return fmt.Errorf("users file: %w", err)
	}
	rdb := redisx.NewClient(redisx.Options{Addrs: cfg.RedisAddrs, DialTimeout: 2 * time.Second, ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second,
		Security: cfg.RedisSecurity})
	run.Closer("redis", rdb.Close)
	checkCtx, cancelCheck := context.WithTimeout(ctx, 5*time.Second)
	err = redisx.CheckAccess(checkCtx, rdb)
	cancelCheck()
	if err != nil {
		_ = rdb.Close()
		return err
	}
	ksec, err := stream.Secure(ctx, cfg.KafkaBrokers, cfg.KafkaSecurity, 5*time.Second, log)
	if err != nil {
		_ = rdb.Close()
		return fmt.Errorf("kafka: %w", err)
	}
	ddb, err := dynamo.NewClient(ctx, cfg.DynamoDB)
	if err != nil {
		_ = rdb.Close()
		return err
	}
	rem, err := newRemotes(cfg, log)
	if err != nil {
		_ = rdb.Close()
		return err
	}
	influx := influxdb2.NewClient(cfg.InfluxURL, cfg.InfluxToken)
	run.Closer("influxdb", func() error { influx.Close(); return nil })
	proxies, err := gateway.ParseTrustedProxies(cfg.TrustedProxies)
	if err != nil {
		return err
	}
	samples := &store.SampleReader{Client: ksec.Client(cfg.KafkaBrokers, cfg.SamplesTimeout),
		Topic: cfg.DecisionsTopic, Timeout: cfg.SamplesTimeout}
	secret := []byte(cfg.SessionSecret)
	if len(secret) == 0 {
		secret = make([]byte, 32)
		if _, err := rand.Read(secret); err != nil {
			return fmt.Errorf("session secret: %w", err)
		}
		log.Warn("FLOODGATE_CONSOLE_SESSION_SECRET is not set: a random secret was made, so sessions end when this console restarts and are valid on this replica only")
	}
	sessions, err := auth.NewSessions(rdb, "fg:console:session:", secret, cfg.SessionIdle, cfg.SessionMax, env.Now)
	if err != nil {
		return err
	}
	// Device cookies under the same secret: a browser that signed in before
	// is never locked out by others' failed sign-ins (issue 22 S9).
	devices, err := auth.NewDeviceCookies(secret, auth.DefaultDeviceTTL, env.Now)
	if err != nil {
		return err
	}
	var wif *web.WhatIf
	if cfg.WhatIfMaxEvents > 0 {
		// Its own client: a replay's pipelines outlast the console's 2 s timeouts.
		wrdb := redisx.NewClient(redisx.Options{Addrs: cfg.RedisAddrs, DialTimeout: 2 * time.Second, ReadTimeout: 10 * time.Second,
			WriteTimeout: 10 * time.Second, Security: cfg.RedisSecurity})
		run.Closer("redis (what-if)", wrdb.Close)
		wif = &web.WhatIf{Redis: wrdb, Timeout: WhatIfTimeout,
			Source: &whatif.Source{Client: ksec.Client(cfg.KafkaBrokers, 10*time.Second), Topic: cfg.DecisionsTopic, MaxEvents: cfg.WhatIfMaxEvents}}
	}
	var rollouts *web.Rollouts
	if cfg.RulesTopic != "" {
		topic := rollout.NewTopic(cfg.KafkaBrokers, ksec, cfg.RulesTopic, log)
		run.Closer("rules topic producer", topic.Close)
		audit := &rollout.DynamoAudit{Client: ddb, Table: cfg.DynamoDB.TablePrefix + dynamo.TableAuditLog}
		claims := &rollout.DynamoClaims{Client: ddb, Table: cfg.DynamoDB.TablePrefix + dynamo.TableAuditLog, Now: env.Now}
		rollouts = &web.Rollouts{Operator: &rollout.Operator{Topic: topic, Audit: audit, Claims: claims, Now: env.Now, Validate: web.ValidateRules},
			Redis: rdb, Audit: audit}
	}
	var proposals *web.Proposals
	if cfg.ParamsTopic != "" {
		topic := rollout.NewTopic(cfg.KafkaBrokers, ksec, cfg.ParamsTopic, log)
		run.Closer("detector parameters topic producer", topic.Close)
		audit := &rollout.DynamoAudit{Client: ddb, Table: cfg.DynamoDB.TablePrefix + dynamo.TableAuditLog, Subject: rollout.ParamsAuditSubject}
		claims := &rollout.DynamoClaims{Client: ddb, Table: cfg.DynamoDB.TablePrefix + dynamo.TableAuditLog, Now: env.Now}
		proposals = &web.Proposals{DDB: ddb, Table: cfg.DynamoDB.TablePrefix + dynamo.TableRuntimeConfig, Audit: audit,
			Operator: &rollout.Operator{Topic: topic, Audit: audit, Claims: claims, Now: env.Now, Validate: web.ValidateParams}}
	}
	verdicts := stream.NewProducer(stream.ProducerConfig{Brokers: cfg.KafkaBrokers, Security: ksec, Topic: cfg.VerdictsTopic,
		Logger: log, Registerer: env.Registry})
	run.Closer("verdicts producer", verdicts.Close)
	networks, prec := cfg.precisionConfig()
	srv, err := web.New(web.Config{
		Directory:     dir,
		Sessions:      sessions,
		Store:         store.New(ddb, rdb, cfg.DynamoDB.TablePrefix, env.Now),
		Log:           log,
		Registry:      env.Registry,
		Now:           env.Now,
		SecureCookies: cfg.SecureCookies,
		PollInterval:  cfg.PollInterval,
		ScalesKey:     cfg.ScalesKey,
		Quota:         rem.quota,
		Adjuster:      rem.adjuster,
		DLQ:           rem.dlq,
		Samples:       samples,
		SignIn:        auth.NewLimiter(rdb, "fg:console:authfail:"),
		Devices:       devices,
		Proxies:       proxies,
		BlockRate:     &blockrate.Reader{Query: influx.QueryAPI(cfg.InfluxOrg), Bucket: cfg.InfluxBucket},
		ScaleSeries:   &adjuster.Series{Query: influx.QueryAPI(cfg.InfluxOrg), Bucket: cfg.InfluxBucket},
		Adjustments: &adjuster.Adjustments{Client: ksec.Client(cfg.KafkaBrokers, 10*time.Second),
			Topic: cfg.AdjustmentsTopic},
		OverridesKey: cfg.OverridesKey,
		WhatIf:       wif,
		Rollouts:     rollouts,
		Proposals:    proposals,
		Deferred:     deferred.NewStore(rdb),
		Verdicts:     &web.KafkaVerdicts{Producer: verdicts, Source: "floodgate/console"},
		Networks:     networks,
		Precision:    prec,
	})
	if err != nil {
		return err
	}
	doc, err := openapi.JSON(openapi.Console)
	if err != nil {
		return err
	}
	addr, err := run.Serve(service.API{Name: "console", Addr: cfg.Addr, Handler: srv, Health: true,
		Metrics: "floodgate_console", AccessLog: true, OpenAPI: doc})
	if err != nil {
		return err
	}
	run.Worker("override sweeper", func(ctx context.Context) error { return srv.ExpireOverrides(ctx, cfg.OverrideSweep) })
	run.Worker("precision", func(ctx context.Context) error { return srv.RefreshPrecision(ctx, time.Minute) })
	run.Worker("users file reload", func(ctx context.Context) error { return dir.Run(ctx, 2*time.Second) })
	log.Info("console listening", "addr", addr.String(), "users_file", cfg.UsersFile)
	return run.Run(ctx)
}
