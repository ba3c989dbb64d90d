// Package limiter decides whether a request may proceed. A principal's tiers,
// its penalty multiplier, the adjuster's scales and its daily quota are evaluated
// in one Lua script under the principal's hash tag; the IP tier (another slot)
// goes in the same pipelined round trip. Nothing is consumed when any tier denies.
//
// This package is the engine only: the rules (rules.go, parse.go, deferral.go),
// the check (check.go) and its script (script.go, check.lua), the Redis shards
// and their breakers (shards.go, batch.go), leases (lease.go), the over-limit
// cache and fail policies (failsafe.go), the adjuster's runtime state
// (runtime.go), rule reloads (reload.go) and candidates in shadow
// (candidate.go). It knows nothing of HTTP, gRPC or rollouts; what serves it
// depends on it:
//
//   - server: the decision service — POST /v1/check, its batch form,
//     readiness, decision events and the 429 contract (checkapi on the wire);
//   - envoyrls: Envoy's rate-limit gRPC service on a server;
//   - embedded: the limiter inside a Go gateway, without the HTTP hop;
//   - callers: who may ask (bearer tokens); admission: priorities, shedding
//     and the shards' adaptive concurrency limit; candidate: the rules topic
//     and rollout impact counts; influxcounts: the adjuster's InfluxDB signals.
//
// The limiter service (services/limiter) wires them.
package limiter

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"net/netip"
	"strconv"
	"strings"
	"sync/atomic"
	"time"

	"github.com/google/uuid"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

//go:embed check.lua
var checkSource string

// Request is what a gateway asks about.
type Request struct {
	Principal events.Principal
	IP        netip.Addr // zero: no IP tier
	Method    string
	Route     string
	Resource  string // "type:id" or ""
	Plan      string // "" = the principal's override plan, else "default"
	Cost      int    // multiplied by the route's cost from the rules file
	// Priority is the request's bucket; admission.PriorityUnset takes the route's
	// default from the rules.
	Priority admission.Priority
	// At, when set, is the decision's clock: the script uses it instead of
	// Redis TIME, and the daily quota's day follows it. Only a replay of
	// recorded decisions sets it (pkg/whatif); no interface of the limiter
	// service lets a caller choose it. Everything of such a check follows At,
	// never a wall clock: the over-limit cache and the local buckets, and the
	// keys it writes live ReplayKeyTTL at least (Redis TTLs run on the wall
	// clock, and a replay runs faster or slower than the traffic did).
	At time.Time
	// Deadline, when set, is the caller's: a check that reaches the engine
	// past it, or is still waiting for a permit or a pipeline when it
	// passes, is not decided (ErrPastDeadline) — the caller has failed open
	// already, and every microsecond spent on it is taken from a caller
	// still waiting.
	Deadline time.Time
}

// ErrPastDeadline is a check not decided because its caller's deadline
// (Request.Deadline) passed first: on arrival at the engine, while it waited
// for a permit, or before its Redis round trip. Nothing was counted. A check
// whose context is already done on arrival (its caller gone) ends the same way.
var ErrPastDeadline = errors.New("the caller's deadline passed before the check was decided")

// pastDeadline reports whether a deadline (zero: none) has passed.
func pastDeadline(d time.Time) bool { return !d.IsZero() && !time.Now().Before(d) }

// ReplayKeyTTL is the least a key written by a check with Request.At lives
// (check.lua's REPLAY_TTL): longer than any replay, so no bucket expires in
// the middle of one however slow it runs.
const ReplayKeyTTL = time.Hour

// TierResult is one rule's answer within a decision.
type TierResult struct {
	Rule       string
	Tier       events.Tier
	Algorithm  Algorithm
	Allowed    bool
	Shadow     bool
	Limit      int64 // effective: rule × scale × penalty
	Remaining  int64
	ResetAfter time.Duration
	RetryAfter time.Duration // zero when allowed
	Period     time.Duration
	Scale      float64
	// Quota is the rule's configured limit (rules file and overrides) before
	// scale and penalty: the q RateLimit-Policy announces, stable while
	// scales move.
	Quota int64
}

// Result is the engine's answer for one request.
type Result struct {
	Allowed    bool
	Tier       events.Tier // denying tier, or when allowed the tier with the least room left
	Rule       string      // id of the deciding rule ("" when no rule applies)
	Limit      int         // effective limit of the deciding rule
	Remaining  int
	ResetAfter time.Duration // until the deciding bucket is full again
	RetryAfter time.Duration // zero when allowed
	Period     time.Duration // window of the deciding rule
	Penalty    float64       // multiplier in (0,1]; 1 means none
	Scale      float64       // adjuster scale of the deciding rule; 1 means none
	Now        time.Time     // Redis time of the decision (local time when degraded or cached)
	Cost       int           // units charged per tier: request cost × route cost
	Shadow     bool          // a shadow rule would have denied
	ShadowRule string        // the first such rule
	NearLimit  bool
	Degraded   bool   // answered by fail policies: Redis was not asked in time
	Error      string // why, for X-RateLimit-Error
	Cached     bool   // denied by the local over-limit cache without asking Redis
	Quota      int    // the deciding rule's configured limit before scale and penalty (RateLimit-Policy's q)
	Tiers      []TierResult
	// Priority is the request's bucket (its own, or the route's default).
	Priority admission.Priority
	// Shed: refused by priority shedding before any limit was asked (Tier is
	// then principal, Limit 0); RetryAfter is the shed state's.
	Shed bool
	// Utilization is the shed state's status while shedding is engaged
	// (admission.StatusDegraded, admission.StatusCritical); "" when nothing is shed.
	Utilization string
	// Plan is the plan the rules were matched with: the request's, else the
	// principal's override plan, else DefaultPlan ("" when shed).
	Plan string
	// RulesVersion is the version of the rules that decided (0: a file).
	// CandidateVersion, when not 0, is the rules version in shadow that
	// judged the request too, and CandidateBlocked its verdict.
	RulesVersion     int64
	CandidateVersion int64
	CandidateBlocked bool
}

// RuleSource returns the rules in force. Must be safe for concurrent use.
type RuleSource interface {
	Rules() *Ruleset
}

// EngineConfig wires an Engine.
type EngineConfig struct {
	Redis   redis.UniversalClient
	Rules   RuleSource
	Runtime *Runtime         // scales and overrides; nil = none
	Clock   func() time.Time // local clock for caches and local buckets; nil = time.Now
	// Budget bounds one check's Redis round trip (FLOODGATE_LIMITER_REDIS_TIMEOUT).
	Budget time.Duration
	// Every Redis shard (the node, or each cluster master) has its own
	// breaker. It opens when, within a sliding BreakerWindow (default 1s), at
	// least BreakerFailures calls failed (default 10) and they were at least
	// BreakerRatio of its calls (default 0.5) — a ratio, so one short stall
	// under load does not open it; it stays open 0.5–1.25 × BreakerOpen
	// (default 200ms: 100–250ms, jittered per breaker), then lets 5 probes
	// through. While open, that shard's checks answer from fail policies
	// without calling Redis.
	BreakerFailures uint32
	BreakerRatio    float64
	BreakerWindow   time.Duration
	BreakerOpen     time.Duration
	// QueueWait bounds how long a check may wait for a pipeline before it is
	// shed (default 4 × Budget): the Redis budget counts Redis time, not
	// queue time, and a limiter past its capacity sheds instead of
	// failing open.
	QueueWait time.Duration
	// ClusterRefresh is how often a cluster's slot table is reloaded
	// (default 1s; also at once after an error).
	ClusterRefresh time.Duration
	// Heartbeat is how often this instance announces itself in
	// redisx.LimitersKey and counts the live limiter instances (default 1s);
	// local answers enforce limit ÷ live instances.
	Heartbeat time.Duration
	// LogEvery bounds Redis error and breaker log lines to one per shard per
	// interval (default 10s); the lines count what they held back.
	LogEvery time.Duration
	// OverLimitEntries bounds the over-limit cache; 0 disables it.
	OverLimitEntries int
	// LocalBuckets bounds the in-process buckets of local answers.
	LocalBuckets int
	// RedisBatch bounds how many concurrent checks share one pipelined Redis
	// write (FLOODGATE_LIMITER_REDIS_BATCH); 0 = 64, 1 = every check on its own.
	RedisBatch int
	// Shadow puts every rule in shadow mode (FLOODGATE_LIMITER_SHADOW).
	Shadow bool
	// RedisLatency, when set, receives every check pipeline's Redis round
	// trip (the adjuster's Redis-latency signal, through ScopeCounts).
	RedisLatency *RedisLatency
	// KeyPrefix is put before every key a check reads or writes (buckets,
	// penalties, day usage), so the engine works in a keyspace of its own:
	// "" for the limiter itself; a what-if replay (pkg/whatif) uses a unique
	// prefix no limiter ever uses. It may not hold '{', '}', spaces or
	// control bytes, so each key keeps its principal's hash tag and slot.
	KeyPrefix string
	Logger    *slog.Logger
	Registry  prometheus.Registerer

	admission *admission.Config // tests only
}

// Engine runs checks. It is safe for concurrent use.
type Engine struct {
	rdb       redis.UniversalClient
	script    *redis.Script
	rules     RuleSource
	cands     candidateSource // nil: Rules holds no candidates
	rt        *Runtime
	clock     func() time.Time
	queueWait time.Duration
	budget    time.Duration
	shards    *shardSet
	overLimit *overLimitCache
	local     *localBuckets
	leases    *leases
	log       *slog.Logger
	m         *engineMetrics
	shadow    bool
	prefix    string // before every key (EngineConfig.KeyPrefix)
	batching  bool
	fixedNow  func() int64 // tests only: a fixed time for the script instead of Redis TIME

	id        string       // this instance in redisx.LimitersKey
	instances atomic.Int64 // live limiter instances, ≥ 1
	refresh   time.Duration
	heartbeat time.Duration
}

type engineMetrics struct {
	redisErrors    prometheus.Counter
	breakerOpen    *prometheus.GaugeVec
	breakerTrips   *prometheus.CounterVec
	admissionLimit *prometheus.GaugeVec
	slotReloads    *prometheus.CounterVec
	readOnly       prometheus.Counter
	instances      prometheus.Gauge
	cacheHits      prometheus.Counter
	leaseHits      prometheus.Counter
	leaseReturned  prometheus.Counter
	degraded       *prometheus.CounterVec
	refunds        *prometheus.CounterVec
	shed           prometheus.Counter
	redisRTT       prometheus.Histogram
	rtt            *RedisLatency                                  // nil: not collected
	prioShed       [admission.PriorityBulk + 1]prometheus.Counter // by Priority; index 0 unused
}

// NewEngine returns an engine; Load the script before serving and Run its
// background loops (slot table, instance heartbeat) while serving.
func NewEngine(c EngineConfig) (*Engine, error) {
	if c.Redis == nil || c.Rules == nil {
		return nil, errors.New("new engine: Redis and Rules are required")
	}
	if err := ValidKeyPrefix(c.KeyPrefix); err != nil {
		return nil, fmt.Errorf("new engine: %w", err)
	}
	if c.Clock == nil {
		c.Clock = time.Now
	}
	config.Default(&c.Budget, 50*time.Millisecond)
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 10
	}
	config.Default(&c.BreakerRatio, 0.5)
	config.Default(&c.BreakerWindow, time.Second)
	config.Default(&c.BreakerOpen, 200*time.Millisecond)
	config.Default(&c.QueueWait, 4*c.Budget)
	config.Default(&c.ClusterRefresh, time.Second)
	config.Default(&c.Heartbeat, time.Second)
	config.Default(&c.LogEvery, 10*time.Second)
	config.Default(&c.LocalBuckets, 100_000)
	if c.Logger == nil {
		c.Logger = slog.New(slog.DiscardHandler)
	}
	if c.Registry == nil {
		c.Registry = prometheus.NewRegistry()
	}
	f := promauto.With(c.Registry)
	m := &engineMetrics{
		redisErrors:    f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_redis_errors_total", Help: "Checks whose Redis round trip failed or timed out, or whose shard's breaker was open."}),
		breakerOpen:    f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_limiter_breaker_open", Help: "1 while a Redis shard's circuit breaker is open, by shard (node address; redis = the single node, cluster = slots not yet mapped)."}, []string{"shard"}),
		breakerTrips:   f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_breaker_trips_total", Help: "Times a Redis shard's circuit breaker opened, by shard."}, []string{"shard"}),
		admissionLimit: f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_limiter_admission_limit", Help: "Adaptive limit of checks in flight to a Redis shard, by shard."}, []string{"shard"}),
		slotReloads:    f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_cluster_slot_reloads_total", Help: "Redis Cluster slot table reloads, by result (same, changed, error)."}, []string{"result"}),
		readOnly:       f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_redis_readonly_total", Help: "Redis answers READONLY (a demoted master), each followed by a reconnect or a slot reload."}),
		instances:      f.NewGauge(prometheus.GaugeOpts{Name: "floodgate_limiter_instances", Help: "Live limiter instances seen in Redis; local answers enforce limit ÷ this."}),
		cacheHits:      f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_overlimit_cache_hits_total", Help: "Checks denied by the local over-limit cache without calling Redis."}),
		leaseHits:      f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_lease_hits_total", Help: "Checks answered from this instance's leases (rules with lease:) without calling Redis."}),
		leaseReturned:  f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_lease_returned_units_total", Help: "Unused leased units given back to Redis when their lease ended."}),
		degraded:       f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_degraded_total", Help: "Tier answers given without Redis, by policy (local when shed) and outcome."}, []string{"policy", "outcome"}),
		refunds:        f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_refunds_total", Help: "Compensating refunds after the IP and principal groups disagreed, by result."}, []string{"result"}),
		shed:           f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_shed_total", Help: "Checks answered from local state because the limiter was past its capacity (admission limit reached, pipeline queue full or too slow)."}),
		redisRTT: f.NewHistogram(prometheus.HistogramOpts{Name: "floodgate_limiter_redis_pipeline_seconds", Help: "Round trip of one pipeline of check scripts to Redis (one per batch of checks), failures and timeouts included.",
			Buckets: []float64{.0005, .001, .002, .005, .01, .02, .03, .04, .05, .075, .1, .25}}),
		rtt: c.RedisLatency,
	}
	byPrio := f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_priority_shed_total", Help: "Checks refused by priority shedding (the adjuster's shed level), by priority."}, []string{"priority"})
	for p := admission.PriorityCritical; p <= admission.PriorityBulk; p++ {
		m.prioShed[p] = byPrio.WithLabelValues(p.String())
	}
	e := &Engine{
		rdb: c.Redis, script: redis.NewScript(checkSource), rules: c.Rules, rt: c.Runtime, clock: c.Clock,
		budget: c.Budget, queueWait: c.QueueWait, shadow: c.Shadow, prefix: c.KeyPrefix, local: newLocalBuckets(c.LocalBuckets), leases: newLeases(c.LocalBuckets), log: c.Logger, m: m,
		id: uuid.Must(uuid.NewV7()).String(), refresh: c.ClusterRefresh, heartbeat: c.Heartbeat,
	}
	e.cands, _ = c.Rules.(candidateSource)
	e.instances.Store(1)
	m.instances.Set(1)
	if c.RedisBatch == 0 {
		c.RedisBatch = 64
	}
	e.batching = c.RedisBatch > 1
	adm := admission.DefaultConfig()
	if c.admission != nil {
		adm = *c.admission
	}
	e.shards = newShardSet(shardConfig{rdb: c.Redis, script: e.script, budget: c.Budget, batch: c.RedisBatch,
		breakerFailures: c.BreakerFailures, breakerRatio: c.BreakerRatio, breakerWindow: c.BreakerWindow,
		breakerOpen: c.BreakerOpen, logEvery: c.LogEvery, admission: adm, log: c.Logger, m: m})
	if c.OverLimitEntries > 0 {
		e.overLimit = newOverLimitCache(c.OverLimitEntries)
	}
	return e, nil
}

// Load puts the script in Redis's cache (every master of a cluster) so the first
// checks skip the NOSCRIPT fallback, and reads a cluster's slot table.
func (e *Engine) Load(ctx context.Context) error {
	if cc, ok := e.rdb.(*redis.ClusterClient); ok {
		if err := cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return e.script.Load(ctx, c).Err()
		}); err != nil {
			return err
		}
		return e.shards.refresh(ctx)
	}
	return e.script.Load(ctx, e.rdb).Err()
}

// Run keeps the cluster's slot table fresh and this instance's heartbeat in
// Redis until ctx is done. Checks are decided with or without it.
func (e *Engine) Run(ctx context.Context) error {
	go e.shards.run(ctx, e.refresh)
	t := time.NewTicker(e.heartbeat)
	defer t.Stop()
	for {
		hctx, cancel := context.WithTimeout(ctx, e.heartbeat)
		e.beat(hctx)
		cancel()
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
	}
}

// beat announces this instance and counts the live ones: members of
// redisx.LimitersKey seen within the last 5 heartbeats.
func (e *Engine) beat(ctx context.Context) {
	now := time.Now().UnixMilli()
	pipe := e.rdb.TxPipeline()
	pipe.ZAdd(ctx, redisx.LimitersKey, redis.Z{Score: float64(now), Member: e.id})
	pipe.ZRemRangeByScore(ctx, redisx.LimitersKey, "-inf", strconv.FormatInt(now-5*e.heartbeat.Milliseconds(), 10))
	card := pipe.ZCard(ctx, redisx.LimitersKey)
	pipe.PExpire(ctx, redisx.LimitersKey, 10*e.heartbeat)
	if _, err := pipe.Exec(ctx); err != nil {
		return // keep the last count while Redis is away
	}
	n := max(card.Val(), 1)
	e.instances.Store(n)
	e.m.instances.Set(float64(n))
}

// Health reports whether every Redis shard's breaker is closed, and each one's state.
func (e *Engine) Health() (bool, map[string]string) { return e.shards.healthy() }

// Instances is how many live limiter instances the heartbeat last counted (≥ 1).
func (e *Engine) Instances() int64 { return e.instances.Load() }

// RedisMaster is the Redis master the engine's client is connected to when
// the client knows it (a Sentinel or standalone redisx client: "" without).
func (e *Engine) RedisMaster() string {
	if m, ok := e.rdb.(interface{ Master() string }); ok {
		return m.Master()
	}
	return ""
}

// RuleSource is where the engine reads the rules in force.
func (e *Engine) RuleSource() RuleSource { return e.rules }

// Runtime is the engine's scales, overrides and shed state; nil without one.
func (e *Engine) Runtime() *Runtime { return e.rt }

// Candidate is the rules version in shadow beside the rules in force, or nil.
func (e *Engine) Candidate() *Candidate {
	if e.cands == nil {
		return nil
	}
	return e.cands.Candidate()
}

// ValidKeyPrefix reports whether p may be an EngineConfig.KeyPrefix.
func ValidKeyPrefix(p string) error {
	for i := 0; i < len(p); i++ {
		if c := p[i]; c == '{' || c == '}' || c <= ' ' || c == 0x7f {
			return fmt.Errorf("key prefix %q: may not hold '{', '}', spaces or control bytes", p)
		}
	}
	return nil
}

// CheckCost returns a *CostError when req would charge a rule or quota it
// matches more than its max_cost (the rules file's max_cost, else
// defaults.max_cost): the interfaces refuse such a check as invalid before
// anything is counted (issue 22 S3). Checks at or below the smallest cap in
// the rules return at once.
func (e *Engine) CheckCost(req Request) error {
	rs := e.rules.Rules()
	if rs.maxRouteCost > 0 && int64(max(req.Cost, 1))*rs.maxRouteCost <= rs.minMaxCost { // no lookup, no allocation
		return nil
	}
	cost := int64(max(req.Cost, 1)) * int64(rs.Cost(req.Method, req.Route))
	if cost <= rs.minMaxCost {
		return nil
	}
	plan, overrideQuota := req.Plan, false
	if e.rt != nil {
		ov := e.rt.Overrides()
		pov := ov.Principal(req.Principal)
		if plan == "" && pov != nil {
			plan = pov.Plan
		}
		if plov := ov.Plan(plan); (plov != nil && plov.Quota > 0) || (pov != nil && pov.Quota > 0) {
			overrideQuota = true
		}
	}
	if plan == "" {
		plan = DefaultPlan
	}
	resType, _, _ := strings.Cut(req.Resource, ":")
	return rs.checkCost(req.Principal.Kind, plan, req.Method, req.Route, resType, req.IP.IsValid(), cost, max(req.Cost, 1), overrideQuota)
}

// Priority and its values are admission's, named here too for importers
// that reach them through the engine's Request (services/adjuster's tests).
type Priority = admission.Priority

// Priorities (admission.PriorityCritical, …).
const (
	PriorityCritical   = admission.PriorityCritical
	PriorityDegraded   = admission.PriorityDegraded
	PriorityBestEffort = admission.PriorityBestEffort
	PriorityBulk       = admission.PriorityBulk
)
