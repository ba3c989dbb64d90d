// Package embedded runs the limiter inside another Go program — a gateway
// that wants decisions without a network hop: the same engine, metrics, 429
// contract and decision events as the limiter service's POST /v1/check.
package embedded

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/journal"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/candidate"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// Config runs the limiter inside another Go program — a gateway that wants
// decisions without a network hop. The embedded limiter shares Redis (buckets,
// penalties, the adjuster's scales, overrides) and the decisions topic with the
// limiter service, so both can serve the same traffic side by side.
type Config struct {
	// Redis holds the buckets; a *redis.ClusterClient works (every key of one
	// principal shares a hash tag). Required. The caller closes it.
	Redis redis.UniversalClient
	// Rules are the rules in force (ParseRules). With RulesFile set instead, the
	// file is loaded, polled every RulesPoll (default 1s) and re-read on every
	// value received from Reload (e.g. SIGHUP); an invalid new file keeps the
	// old rules. Exactly one of Rules and RulesFile is required.
	Rules     *limiter.Ruleset
	RulesFile string
	RulesPoll time.Duration
	Reload    <-chan os.Signal
	// RulesTopic, when set, is the rules topic on Brokers (floodgate.rules.v1,
	// docs/rollouts.md): its enforced version replaces Rules or RulesFile,
	// which stay in force only until the topic holds one (the file is then
	// not watched), and its candidate runs in shadow beside them. New
	// reads the topic for up to RulesTopicWait (default 5s) before it
	// returns; a topic it cannot read in time is logged, and followed after.
	RulesTopic     string
	RulesTopicWait time.Duration

	// Brokers and Topic (default config.DefaultDecisionsTopic) receive the
	// decision events the detector and the quota ledger consume. Journal keeps
	// them on disk while Kafka is unreachable (an empty Dir disables it) and
	// EventBuffer bounds the in-memory queue (default 65,536). Publisher, when
	// set, replaces the Kafka producer (Brokers and Journal are then unused).
	Brokers     []string
	Kafka       *stream.Security // TLS and SASL to the brokers; nil is plaintext
	Topic       string
	Journal     journal.Config
	EventBuffer int
	Publisher   server.Publisher

	// Gateway names this gateway in decision events. Required, 1..64 characters.
	Gateway string
	// Observer receives per-scope counts (e.g. NewScopeCounts); nil = none.
	Observer server.Observer
	// RedisLatency receives the Redis round trips (ScopeCounts.RedisLatency); nil = none.
	RedisLatency *limiter.RedisLatency

	// Budget bounds one check's Redis round trip (default 50ms); past it, or
	// while its Redis shard's breaker is open (at least BreakerFailures
	// failures, default 10, making half of the shard's calls within a
	// sliding second; open for 0.5–1.25 × BreakerOpen, default 200ms), a
	// check is answered by the rules' fail policies. A check beyond the
	// shard's adaptive concurrency limit, or that cannot get a pipeline
	// (queue full, or queued past 4 × Budget), is shed: answered from local
	// state (over-limit cache, this instance's share of each limit), never
	// failed open. OverLimitEntries sizes the over-limit cache (default
	// 100,000; negative disables), RedisBatch the pipelined batch (default 64).
	Budget           time.Duration
	BreakerFailures  int
	BreakerOpen      time.Duration
	OverLimitEntries int
	RedisBatch       int
	// Shadow puts every rule in shadow mode.
	Shadow bool
	// Callers, when set, is who may ask for checks over HTTP and gRPC
	// (Server, NewGRPCServer); in-process checks are the embedding program's own.
	Callers *callers.Callers
	// RuntimePoll is how often scales and overrides are re-read (default 1s).
	RuntimePoll time.Duration

	Logger   *slog.Logger         // default slog.Default()
	Registry *prometheus.Registry // default a private registry (see Limiter.Registry)
	// Tracing, when on, traces every decision and its event (ServerConfig.Tracing).
	Tracing tracing.Tracing
}

func (c *Config) defaults() {
	if c.Topic == "" {
		c.Topic = config.DefaultDecisionsTopic
	}
	if c.RulesPoll == 0 {
		c.RulesPoll = time.Second
	}
	if c.RuntimePoll == 0 {
		c.RuntimePoll = time.Second
	}
	if c.RulesTopicWait == 0 {
		c.RulesTopicWait = 5 * time.Second
	}
	if c.EventBuffer == 0 {
		c.EventBuffer = 65536
	}
	if c.Budget == 0 {
		c.Budget = 50 * time.Millisecond
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 10
	}
	if c.BreakerOpen == 0 {
		c.BreakerOpen = 200 * time.Millisecond
	}
	switch {
	case c.OverLimitEntries == 0:
		c.OverLimitEntries = 100_000
	case c.OverLimitEntries < 0:
		c.OverLimitEntries = 0
	}
	if c.Logger == nil {
		c.Logger = slog.Default()
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
}

func (c *Config) validate() error {
	var v config.Check
	v.Require(c.Redis != nil, "Redis", "required")
	v.Require((c.Rules == nil) != (c.RulesFile == ""), "Rules", "exactly one of Rules and RulesFile is required")
	v.Require(len(c.Gateway) >= 1 && len(c.Gateway) <= 64, "Gateway", "1 to 64 characters")
	v.Require(c.Publisher != nil || len(c.Brokers) > 0, "Brokers", "at least one host:port (or a Publisher)")
	v.Require(c.RulesPoll >= 10*time.Millisecond, "RulesPoll", "%s: must be at least 10ms", c.RulesPoll)
	v.Require(c.RuntimePoll >= 10*time.Millisecond, "RuntimePoll", "%s: must be at least 10ms", c.RuntimePoll)
	v.Require(c.Budget >= time.Millisecond && c.Budget <= 5*time.Second, "Budget", "%s: must be in 1ms..5s", c.Budget)
	v.Require(c.BreakerFailures >= 1 && c.BreakerFailures <= 1000, "BreakerFailures", "%d: must be in 1..1000", c.BreakerFailures)
	v.Require(c.BreakerOpen >= 10*time.Millisecond && c.BreakerOpen <= time.Minute, "BreakerOpen", "%s: must be in 10ms..1m", c.BreakerOpen)
	v.Require(c.RedisBatch >= 0 && c.RedisBatch <= 1024, "RedisBatch", "%d: must be in 0..1024 (0 = default)", c.RedisBatch)
	v.Require(c.EventBuffer >= 1, "EventBuffer", "%d: must be at least 1", c.EventBuffer)
	v.Require(c.RulesTopic == "" || len(c.Brokers) > 0, "RulesTopic", "needs Brokers to read it from")
	return v.Err()
}

// ErrRulesFile wraps New's errors about Config.RulesFile.
var ErrRulesFile = errors.New("embedded limiter: rules file")

// Limiter decides in-process — the same engine, metrics, 429 contract and
// decision events as the limiter's POST /v1/check, without the HTTP hop. It is a
// gateway.Checker, so pkg/gateway's Middleware and NewReverseProxy take it as is.
// Safe for concurrent use.
type Limiter struct {
	s *server.Server
	// set by New; nil for FromServer (the server's owner runs them)
	run func(ctx context.Context) error
	// impact counts the rules topic's versions (nil without a RulesTopic)
	impact *candidate.ImpactFlusher
}

var _ gateway.Checker = (*Limiter)(nil)

// FromServer returns an in-process checker on s; s's owner runs its producer.
func FromServer(s *server.Server) *Limiter { return &Limiter{s: s} }

// New builds a limiter inside the calling program: it loads the check
// script and the current scales and overrides from Redis (both bounded by ctx)
// and prepares the decision-event producer. Call Run to start the background
// loops; checks made before Run are decided, and their events queue until Run.
func New(ctx context.Context, c Config) (*Limiter, error) {
	c.defaults()
	if err := c.validate(); err != nil {
		return nil, fmt.Errorf("embedded limiter: %w", err)
	}
	rules, data := c.Rules, []byte(nil)
	if c.RulesFile != "" {
		var err error
		if rules, data, err = limiter.LoadRulesFile(c.RulesFile); err != nil {
			return nil, fmt.Errorf("%w: %w", ErrRulesFile, err)
		}
	}
	store := limiter.NewRuleStore(rules)
	runtime := limiter.NewRuntime(c.Redis, c.Logger, c.Registry)
	engine, err := limiter.NewEngine(limiter.EngineConfig{
		Redis: c.Redis, Rules: store, Runtime: runtime, Budget: c.Budget,
		BreakerFailures: uint32(c.BreakerFailures), BreakerOpen: c.BreakerOpen,
		OverLimitEntries: c.OverLimitEntries, RedisBatch: c.RedisBatch, Shadow: c.Shadow,
		RedisLatency: c.RedisLatency, Logger: c.Logger, Registry: c.Registry,
	})
	if err != nil {
		return nil, fmt.Errorf("embedded limiter: %w", err)
	}
	// Redis down at start is an outage to ride out, not a reason to refuse:
	// checks answer from the fail policies until it returns (the script is
	// sent again on NOSCRIPT, scales and overrides are polled).
	lctx, cancelLoad := context.WithTimeout(ctx, 500*time.Millisecond)
	defer cancelLoad()
	if err := engine.Load(lctx); err != nil {
		c.Logger.Warn("redis unreachable at start; answering from the rules' fail policies until it returns", "err", err)
	} else if err := runtime.Refresh(lctx); err != nil {
		c.Logger.Warn("read limit scales and overrides at start; using none until the next poll", "err", err)
	}

	var runs []func(context.Context) error
	pub := c.Publisher
	if pub == nil {
		p, err := journal.NewDurableProducer(journal.DurableProducerConfig{
			Async: stream.AsyncProducerConfig{Name: "decisions", Brokers: c.Brokers, Security: c.Kafka, Topic: c.Topic,
				BufferSize: c.EventBuffer, Logger: c.Logger, Registerer: c.Registry},
			Journal: c.Journal,
		})
		if err != nil {
			return nil, fmt.Errorf("embedded limiter: decision producer: %w", err)
		}
		pub = p
		runs = append(runs, p.Run)
	}
	runs = append(runs, func(ctx context.Context) error { return runtime.Run(ctx, c.RuntimePoll) }, engine.Run)
	var impact *candidate.ImpactFlusher
	if c.RulesTopic != "" {
		impact = candidate.NewImpactFlusher(c.Redis, c.RulesTopic, c.Logger)
		feed := candidate.NewRulesFeed(rollout.NewTopic(c.Brokers, c.Kafka, c.RulesTopic, c.Logger), store, impact, c.Logger, c.Registry)
		sctx, cancel := context.WithTimeout(ctx, c.RulesTopicWait)
		err := feed.Sync(sctx)
		cancel()
		if err != nil {
			c.Logger.Warn("rules topic unreadable at start; serving the fallback rules until it is read", "topic", c.RulesTopic,
				"fallback", rules.Source, "err", err)
		}
		runs = append(runs, feed.Run, func(ctx context.Context) error { return impact.Run(ctx, time.Second) })
	} else if c.RulesFile != "" {
		r := limiter.NewReloader(c.RulesFile, data, store, c.RulesPoll, c.Reload, c.Logger, c.Registry)
		runs = append(runs, r.Run)
	}
	srv := server.New(server.Config{Callers: c.Callers, Engine: engine, Publisher: pub, Observer: c.Observer, Topic: c.Topic,
		Gateway: c.Gateway, Logger: c.Logger, Registry: c.Registry, Tracing: c.Tracing})
	srv.SetReady(true)
	e := &Limiter{s: srv, impact: impact}
	e.run = func(ctx context.Context) error {
		var g errgroup.Group
		for _, f := range runs {
			g.Go(func() error { return f(ctx) })
		}
		return g.Wait()
	}
	return e, nil
}

// Run runs the background loops — the decision-event producer (with its
// journal), the scales and overrides poll, the rules-file reloader — until ctx
// is done, then flushes the queued decision events (bounded by the producer's
// own timeouts; with a journal, what Kafka does not take stays on disk for the
// next start). For a checker from FromServer it only waits for ctx.
func (e *Limiter) Run(ctx context.Context) error {
	if e.run == nil {
		<-ctx.Done()
		return nil
	}
	return e.run(ctx)
}

// Server is the limiter's HTTP API on the same engine (POST /v1/check and
// the batch form; ServeReady answers a readiness probe, Registry holds the
// metrics), for a gateway that also wants to answer remote checks;
// NewGRPCServer(e.Server()) adds Envoy's API.
func (e *Limiter) Server() *server.Server { return e.s }

// Rules returns the rules in force.
func (e *Limiter) Rules() *limiter.Ruleset { return e.s.Engine().RuleSource().Rules() }

// Registry is where the embedded limiter's Prometheus metrics are registered.
func (e *Limiter) Registry() *prometheus.Registry { return e.s.Registry() }

// Check validates and decides one request exactly as the HTTP API does.
func (e *Limiter) Check(ctx context.Context, r gateway.Request) (gateway.Decision, error) {
	req := r // a copy: Validate completes it
	if err := req.Validate(); err != nil {
		return gateway.Decision{}, fmt.Errorf("check: %w", err)
	}
	if err := e.s.CheckCost(&req); err != nil {
		return gateway.Decision{}, fmt.Errorf("check: %w", err)
	}
	resp := e.s.Decide(ctx, uuid.Must(uuid.NewV7()).String(), &req)
	d := gateway.Decision{
		ID: resp.ID, Allowed: resp.Allowed, Tier: string(resp.Tier), Limit: resp.Limit, Remaining: resp.Remaining,
		ResetAfterMS: resp.ResetAfterMS, RetryAfterMS: resp.RetryAfterMS, PenaltyMultiplier: resp.PenaltyMultiplier,
		Shed: resp.Shed, Headers: resp.Headers,
	}
	if resp.Problem != nil {
		p, err := json.Marshal(resp.Problem)
		if err != nil {
			return gateway.Decision{}, fmt.Errorf("encode problem: %w", err)
		}
		d.Problem = p
	}
	return d, nil
}

// Candidate returns the rules version in shadow beside the rules in force,
// or nil.
func (e *Limiter) Candidate() *limiter.Candidate { return e.s.Engine().Candidate() }
