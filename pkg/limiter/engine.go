// Package limiter decides whether a request may proceed. A principal's tiers,
// its penalty multiplier, the adjuster's scales and its daily quota are evaluated
// in one Lua script under the principal's hash tag; the IP tier (another slot)
// goes in the same pipelined round trip. Nothing is consumed when any tier denies.
//
// The limiter service (services/limiter) serves it over HTTP, Envoy's gRPC API and
// its reverse-proxy mode; Go gateways embed it with NewEmbedded.
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

	"github.com/floodgate-dev/floodgate/pkg/events"
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
	// Priority is the request's bucket; PriorityUnset takes the route's
	// default from the rules.
	Priority Priority
	// At, when set, is the decision's clock: the script uses it instead of
	// Redis TIME, and the daily quota's day follows it. Only a replay of
	// recorded decisions sets it (pkg/whatif); no interface of the limiter
	// service lets a caller choose it. Everything of such a check follows At,
	// never a wall clock: the over-limit cache and the local buckets, and the
	// keys it writes live ReplayKeyTTL at least (Redis TTLs run on the wall
	// clock, and a replay runs faster or slower than the traffic did).
	At time.Time
}

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
	Priority Priority
	// Shed: refused by priority shedding before any limit was asked (Tier is
	// then principal, Limit 0); RetryAfter is the shed state's.
	Shed bool
	// Utilization is the shed state's status while shedding is engaged
	// (StatusDegraded, StatusCritical); "" when nothing is shed.
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

	admission *admissionConfig // tests only
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
	rtt            *RedisLatency                        // nil: not collected
	prioShed       [PriorityBulk + 1]prometheus.Counter // by Priority; index 0 unused
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
	if c.Budget <= 0 {
		c.Budget = 50 * time.Millisecond
	}
	if c.BreakerFailures == 0 {
		c.BreakerFailures = 10
	}
	if c.BreakerRatio <= 0 {
		c.BreakerRatio = 0.5
	}
	if c.BreakerWindow <= 0 {
		c.BreakerWindow = time.Second
	}
	if c.BreakerOpen <= 0 {
		c.BreakerOpen = 200 * time.Millisecond
	}
	if c.QueueWait <= 0 {
		c.QueueWait = 4 * c.Budget
	}
	if c.ClusterRefresh <= 0 {
		c.ClusterRefresh = time.Second
	}
	if c.Heartbeat <= 0 {
		c.Heartbeat = time.Second
	}
	if c.LogEvery <= 0 {
		c.LogEvery = 10 * time.Second
	}
	if c.LocalBuckets <= 0 {
		c.LocalBuckets = 100_000
	}
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
	for p := PriorityCritical; p <= PriorityBulk; p++ {
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
	adm := defaultAdmission()
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

// bound is one rule bound to one request: its keys and effective arguments.
type bound struct {
	id     string
	tier   events.Tier
	alg    Algorithm
	limit  int64
	period time.Duration
	burst  int64
	scale  float64
	cost   int64
	shadow bool
	fail   FailPolicy
	lease  int64 // units a Redis take may lease to this instance (lease.go); 0 = none
	keys   []string
	days   []int64 // day numbers of keys, for the daily quota
}

// group is the rules of one hash tag: one script call.
type group struct {
	penaltyKey string
	penalize   bool
	rules      []bound
	now        string // the script's clock in ms, or "" for Redis TIME
	replay     bool   // now is a replayed decision's own time (Request.At)
}

func (g *group) args(mode string, now string, mask string) ([]string, []any) {
	keys := make([]string, 0, len(g.rules)+2)
	keys = append(keys, g.penaltyKey)
	args := make([]any, 0, 5+10*len(g.rules))
	pen := "0"
	if g.penalize {
		pen = "1"
	}
	if mode == "c" && g.replay {
		mode = "p" // a check on a replay's clock: check.lua keeps its keys ReplayKeyTTL at least
	}
	args = append(args, mode, now, pen, mask, len(g.rules))
	for _, b := range g.rules {
		shadow := "0"
		if b.shadow {
			shadow = "1"
		}
		keys = append(keys, b.keys...)
		args = append(args, b.alg.code(), b.limit, b.period.Milliseconds(), b.burst,
			strconv.FormatFloat(b.scale, 'g', -1, 64), b.cost, shadow, b.lease, len(b.keys))
		for _, d := range b.days {
			args = append(args, d)
		}
	}
	return keys, args
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

// bind resolves the rules that apply to req, and the plan they were matched with.
func (e *Engine) bind(rs *Ruleset, req Request) (principal, ip group, cost int64, plan string) {
	kind, id := string(req.Principal.Kind), req.Principal.ID
	var pov, plov *Override
	var scales Scales
	req.Plan, pov, plov, scales = e.overridesFor(req.Principal, req.Plan)
	cost = int64(max(req.Cost, 1)) * int64(rs.Cost(req.Method, req.Route))
	resType, _, _ := strings.Cut(req.Resource, ":")

	now, replay := e.nowArg(), !req.At.IsZero()
	if replay {
		now = strconv.FormatInt(req.At.UnixMilli(), 10)
	}
	principal = group{penaltyKey: e.prefix + redisx.PenaltyKey(kind, id), penalize: true, now: now, replay: replay}
	ip.now, ip.replay = now, replay
	var ipID string
	for i := range rs.Rules {
		r := &rs.Rules[i]
		if !r.Matches(req.Principal.Kind, req.Plan, req.Method, req.Route, resType) {
			continue
		}
		b := bound{id: r.ID, tier: r.Tier, alg: r.Algorithm, limit: int64(r.Limit), period: r.Period,
			burst: int64(r.Burst), cost: cost, shadow: r.Shadow || rs.Shadow || e.shadow, fail: r.Fail,
			scale: scales.For(r.Tier, req.Method, req.Route)}
		if r.Lease > 0 && !b.shadow && req.At.IsZero() { // a replay is judged exactly
			b.lease = int64(r.Lease)
		}
		if plov != nil {
			b.limit, b.burst = plov.apply(r.ID, b.limit, b.burst)
		}
		if pov != nil {
			b.limit, b.burst = pov.apply(r.ID, b.limit, b.burst)
		}
		sub := r.ID + "|" + r.Algorithm.code()
		switch r.Tier {
		case events.TierIP:
			if !req.IP.IsValid() {
				continue
			}
			if ipID == "" {
				ipID = ipBucketID(req.IP)
			}
			b.keys = []string{e.prefix + redisx.BucketKey("ip", ipID, sub)}
			ip.rules = append(ip.rules, b)
			continue
		case events.TierResource:
			sub += "|" + req.Resource
		}
		b.keys = []string{e.prefix + redisx.BucketKey(kind, id, sub)}
		principal.rules = append(principal.rules, b)
	}
	if ipID != "" {
		ip.penaltyKey = e.prefix + redisx.PenaltyKey("ip", ipID) // never written: keeps KEYS[1] on the IP's slot
	}

	if qb, ok := e.quotaBound(rs, req.Principal, req.Plan, plov, pov, cost, req.At); ok {
		principal.rules = append(principal.rules, qb)
	}
	return principal, ip, cost, req.Plan
}

// overridesFor resolves a principal's plan (plan, else its override's plan,
// else DefaultPlan), its override and its plan's, and the scales in force.
func (e *Engine) overridesFor(p events.Principal, plan string) (string, *Override, *Override, Scales) {
	var pov, plov *Override
	var scales Scales
	if e.rt != nil {
		ov := e.rt.Overrides()
		pov = ov.Principal(p)
		scales = e.rt.Scales()
		if plan == "" && pov != nil {
			plan = pov.Plan
		}
		plov = ov.Plan(plan)
	}
	if plan == "" {
		plan = DefaultPlan
	}
	return plan, pov, plov, scales
}

// quotaBound is the principal's daily quota on plan as one rule: the rules
// file's quota, or an override's; false when it has none. Its keys are the
// day counters around at (the engine's clock when zero), in the principal's
// slot.
func (e *Engine) quotaBound(rs *Ruleset, p events.Principal, plan string, plov, pov *Override, cost int64, at time.Time) (bound, bool) {
	kind, id := string(p.Kind), p.ID
	q := rs.Quota(p.Kind, plan)
	limit := int64(0)
	var qb bound
	if q != nil {
		limit = q.Limit
		qb = bound{id: q.ID(), shadow: q.Shadow || rs.Shadow || e.shadow, fail: q.Fail}
	}
	for _, o := range []*Override{plov, pov} {
		if o != nil && o.Quota > 0 {
			limit = o.Quota
			if q == nil {
				qb = bound{id: "quota-" + kind + "-" + plan, shadow: rs.Shadow || e.shadow, fail: FailOpen}
			}
		}
	}
	if limit <= 0 {
		return bound{}, false
	}
	qb.tier, qb.alg, qb.limit, qb.period, qb.scale, qb.cost = events.TierQuota, dayQuota, limit, 24*time.Hour, 1, cost
	now := e.localNow(at).UTC()
	for _, t := range []time.Time{now.Add(-10 * time.Minute), now.Add(10 * time.Minute)} {
		day := t.Unix() / 86400
		if len(qb.days) > 0 && qb.days[len(qb.days)-1] == day {
			continue
		}
		qb.days = append(qb.days, day)
		qb.keys = append(qb.keys, e.prefix+redisx.DayUsageKey(kind, id, t.Format(time.DateOnly)))
	}
	return qb, true
}

// ipBucketID is the IP tier's counting unit: the IPv4 address, or the IPv6 /64.
func ipBucketID(a netip.Addr) string {
	a = a.Unmap()
	if a.Is4() {
		return a.String()
	}
	return netip.PrefixFrom(a, 64).Masked().String()
}

// Check decides req: every matching rule, one Redis round trip, all or nothing.
// It returns an error only for a request it cannot evaluate. A group of rules
// whose Redis shard cannot be asked is answered without Redis: by the rules'
// fail policies when the shard is failing (its breaker open, or the call
// failed), from local state when the limiter is past its capacity (shed); the
// answer has Result.Degraded set either way, and groups on healthy shards
// are still decided by Redis.
func (e *Engine) Check(ctx context.Context, req Request) (Result, error) {
	rs := e.rules.Rules()
	prio := req.Priority
	if prio == PriorityUnset {
		prio = rs.Priority(req.Method, req.Route)
	}
	var status string
	if e.rt != nil {
		if sh := e.rt.Shedding(); sh.Level > 0 {
			if sh.Sheds(prio) {
				e.m.prioShed[prio].Inc()
				return Result{Tier: events.TierPrincipal, RetryAfter: sh.RetryAfter, ResetAfter: sh.RetryAfter, Penalty: 1, Scale: 1,
					Now: e.localNow(req.At).UTC(), Cost: max(req.Cost, 1), Priority: prio, Shed: true, Utilization: sh.Status()}, nil
			}
			status = sh.Status()
		}
	}
	// A candidate in shadow judges the request beside the enforced rules,
	// concurrently (its own buckets; the answer waits for the slower of the
	// two round trips, which share the shard's pipelines).
	var cand *Candidate
	var verdict chan candidateVerdict
	if e.cands != nil {
		if cand = e.cands.Candidate(); cand != nil {
			verdict = make(chan candidateVerdict, 1)
			go func() { verdict <- e.checkCandidate(ctx, cand, req) }()
		}
	}
	res, err := e.check(ctx, rs, req)
	res.Priority, res.Utilization, res.RulesVersion = prio, status, rs.Version
	judged := err == nil && !res.Degraded // a fail policy's answer says nothing about the rules
	if verdict != nil {
		v := <-verdict
		switch {
		case v.ok && judged:
			res.CandidateVersion, res.CandidateBlocked = cand.Version, v.blocked
			if cand.impact != nil {
				cand.impact.add(prio, v.blocked)
				cand.impact.addPaired(prio, req, res.Plan, v.blocked, !res.Allowed)
			}
		case !v.ok && cand.impact != nil:
			cand.impact.errors.Add(1)
		}
	}
	if rs.impact != nil && judged {
		rs.impact.add(prio, !res.Allowed)
	}
	return res, err
}

// check runs the rules for one admitted request.
func (e *Engine) check(ctx context.Context, rs *Ruleset, req Request) (Result, error) {
	pg, ig, cost, plan := e.bind(rs, req)
	// The local clock of the over-limit cache and the local buckets: the
	// decision's own time in a replay, so nothing of a replay follows the
	// wall clock (a cache entry held "until" wall time would deny a replayed
	// request its event time allows); the engine's clock, read when used,
	// otherwise (localNow).
	groups := make([]*group, 0, 2)
	if len(pg.rules) > 0 {
		groups = append(groups, &pg)
	}
	if len(ig.rules) > 0 {
		groups = append(groups, &ig)
	}
	if len(groups) == 0 {
		return Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1, Scale: 1, Now: e.localNow(req.At).UTC(), Cost: int(cost), Plan: plan}, nil
	}
	if r, ok := e.fromOverLimitCache(groups, cost, e.localNow(req.At)); ok {
		e.m.cacheHits.Inc()
		r.Plan = plan
		return finish(r, rs.NearLimit), nil
	}
	if e.hasLeases(groups) { // one clock read for both; checks without leases skip them
		now := e.clock()
		if r, ok := e.fromLeases(groups, plan, now); ok {
			return finish(r, rs.NearLimit), nil
		}
		e.askLeases(groups, now)
	}

	// Admit each group to its shard — once per shard when both groups share
	// one: the breaker first (a failing shard costs nothing), then the
	// shard's adaptive concurrency limit.
	calls := make([]shardCall, len(groups))
	remote := 0
	for i, g := range groups {
		c := &calls[i]
		c.sh = e.shards.of(g.penaltyKey)
		if i > 0 && calls[0].sh == c.sh {
			c.local, c.follows = calls[0].local, true
			if c.local == 0 {
				remote++
			}
			continue
		}
		done, err := c.sh.breaker.Allow()
		if err != nil {
			c.local = localOutage
			continue
		}
		if !c.sh.adm.acquire() {
			done(errOverloaded)
			c.local = localShed
			continue
		}
		c.done, c.start = done, time.Now()
		remote++
	}
	raw := make([]any, len(groups))
	errs := make([]error, len(groups))
	if remote > 0 {
		e.runShards(ctx, groups, calls, raw, errs)
	}
	// Each shard's outcome: its breaker and admission limit hear it once.
	var canceled error
	for i := range calls {
		c := &calls[i]
		if c.done == nil {
			continue
		}
		c.sh.adm.release(c.start)
		err := errs[i]
		for j := i + 1; j < len(calls) && err == nil; j++ {
			if calls[j].follows {
				err = errs[j]
			}
		}
		why := 0
		switch {
		case err == nil:
			c.done(nil)
		case errors.Is(err, errOverloaded):
			c.done(err)
			why = localShed
		case ctx.Err() != nil:
			c.done(context.Canceled)
			canceled = ctx.Err()
		default:
			e.shards.failed(c.sh, err)
			c.done(err)
			why = localFailed
		}
		for j := i; j < len(calls); j++ {
			if j == i || calls[j].follows {
				calls[j].local = why
			}
		}
	}
	if canceled != nil {
		return Result{}, fmt.Errorf("check %s: %w", req.Principal.Key(), canceled)
	}

	res := Result{Allowed: true, Penalty: 1, Cost: int(cost), Plan: plan}
	var local []*group
	outs := make([]scriptOut, len(groups))
	for i, g := range groups {
		if calls[i].local != 0 {
			local = append(local, g)
			continue
		}
		o, err := parseOut(raw[i], len(g.rules))
		if err != nil {
			return Result{}, fmt.Errorf("check %s: %w", req.Principal.Key(), err)
		}
		outs[i] = o
		res.Allowed = res.Allowed && o.allowed
		if g.penalize {
			res.Penalty = o.mult
		}
		res.Now = o.now
		n := e.instances.Load()
		now := e.localNow(req.At)
		for j, t := range o.tiers {
			b := g.rules[j]
			t.Rule, t.Tier, t.Algorithm, t.Shadow, t.Period, t.Scale, t.Quota = b.id, b.tier, b.alg, b.shadow, b.period, b.scale, b.limit
			if !t.Allowed && t.RetryAfter < 0 {
				t.RetryAfter = max(t.ResetAfter, b.period) // cannot fit at this limit
			}
			res.Tiers = append(res.Tiers, t)
			if t.Shadow {
				continue
			}
			if !t.Allowed && e.overLimit != nil && t.RetryAfter > 0 {
				e.overLimit.put(b.keys[0], b.sig(), t, o.mult, cost, now, now.Add(t.RetryAfter))
			}
			// What Redis said is where this key's local bucket stands: a
			// shed or degraded answer for it continues from there.
			if b.lease > 0 && j < len(o.took) && o.mask[j] == '1' {
				e.keepLease(g, &b, t, o.took[j], o.mult, now)
			}
			lim, capacity := localLimits(&b)
			taken := int64(0)
			if t.Allowed {
				taken = cost
			}
			e.local.observe(b.keys[0], lim, capacity, t.Remaining, taken, b.period, n, now)
		}
	}
	if len(local) > 0 {
		shedOnly := true
		for i := range calls {
			if calls[i].local == localOutage || calls[i].local == localFailed {
				shedOnly = false
			}
		}
		var lr Result
		switch {
		case shedOnly:
			e.m.shed.Inc()
			lr = e.shed(local, cost, e.localNow(req.At))
		default:
			e.m.redisErrors.Inc()
			reason := "redis unavailable"
			for i := range calls {
				if calls[i].local == localOutage {
					reason = "redis circuit open"
				}
			}
			lr = e.degrade(local, cost, reason, e.localNow(req.At))
		}
		res.Allowed = res.Allowed && lr.Allowed
		res.Degraded, res.Error = true, lr.Error
		res.Tiers = append(res.Tiers, lr.Tiers...)
		if res.Now.IsZero() {
			res.Now = lr.Now
		}
	}
	// Each group commits all or nothing; when one committed and the whole
	// was denied (another group denied, in Redis or locally), give the
	// committed units back.
	if !res.Allowed && len(groups) == 2 {
		for i, g := range groups {
			if calls[i].local == 0 && outs[i].allowed && strings.Contains(outs[i].mask, "1") {
				e.refund(ctx, g, outs[i].mask)
			}
		}
	}
	return finish(res, rs.NearLimit), nil
}

// Why a group was answered without Redis.
const (
	localShed   = 1 + iota // past capacity: the admission limit or the pipeline queue
	localOutage            // the shard's breaker is open
	localFailed            // the call failed or timed out
)

// shardCall is one group's way to Redis.
type shardCall struct {
	sh      *shard
	done    func(error) // the breaker's callback; nil when not sent or when it follows
	start   time.Time
	local   int  // why answered without Redis; 0 = by Redis
	follows bool // shares the first group's shard: admitted with it
}

// localNow is a request's time for the engine's in-process state (the
// over-limit cache, the local buckets) and for answers Redis did not give:
// its Request.At (at) in a replay, else the engine's clock.
func (e *Engine) localNow(at time.Time) time.Time {
	if !at.IsZero() {
		return at
	}
	return e.clock()
}

func (e *Engine) nowArg() string {
	if e.fixedNow != nil {
		return strconv.FormatInt(e.fixedNow(), 10)
	}
	return ""
}

// runShards sends the admitted groups' script calls, one pipeline per shard
// (concurrently when they are on two shards), and fills raw and errs per group.
// The wait counts Redis time (each pipeline's own budget) plus the longest a
// check may queue for a pipeline.
func (e *Engine) runShards(ctx context.Context, groups []*group, calls []shardCall, raw []any, errs []error) {
	wait := e.budget
	if e.batching {
		wait += e.queueWait
	}
	rctx, cancel := context.WithTimeout(ctx, wait)
	defer cancel()
	var idx [2][]int // group indexes per distinct shard (two groups at most)
	var shards [2]*shard
	for i := range groups {
		if calls[i].local != 0 {
			continue
		}
		k := 0
		if shards[0] != nil && shards[0] != calls[i].sh {
			k = 1
		}
		shards[k] = calls[i].sh
		idx[k] = append(idx[k], i)
	}
	one := func(k int) {
		gs := make([]*group, len(idx[k]))
		for j, i := range idx[k] {
			gs[j] = groups[i]
		}
		out, perr, err := e.run(rctx, shards[k], gs)
		for j, i := range idx[k] {
			switch {
			case err != nil:
				errs[i] = err
			case perr[j] != nil:
				errs[i] = perr[j]
			default:
				raw[i] = out[j]
			}
		}
	}
	if len(idx[1]) == 0 {
		one(0)
		return
	}
	done := make(chan struct{})
	go func() { one(1); close(done) }()
	one(0)
	<-done
}

// run sends one script call per group to one shard in one pipelined round
// trip (EVALSHA, falling back to EVAL when a node answers NOSCRIPT): through
// the shard's batcher, shared with concurrent checks, or on its own. It
// returns one answer and one error per group, or an error for all.
func (e *Engine) run(ctx context.Context, sh *shard, groups []*group) ([]any, []error, error) {
	if sh.batch != nil {
		calls := make([]scriptCall, len(groups))
		for i, g := range groups {
			calls[i].keys, calls[i].args = g.args("c", g.now, "")
		}
		return sh.batch.run(ctx, calls)
	}
	rctx, cancel := context.WithTimeout(ctx, e.budget)
	defer cancel()
	defer e.m.roundTrip(time.Now())
	if len(groups) == 1 {
		keys, args := groups[0].args("c", groups[0].now, "")
		v, err := e.script.Run(rctx, e.rdb, keys, args...).Result()
		if err != nil {
			return nil, []error{fmt.Errorf("run check script: %w", err)}, nil
		}
		return []any{v}, []error{nil}, nil
	}
	exec := func(sha bool) []*redis.Cmd {
		pipe := e.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(groups))
		for i, g := range groups {
			keys, args := g.args("c", g.now, "")
			if sha {
				cmds[i] = e.script.EvalSha(rctx, pipe, keys, args...)
			} else {
				cmds[i] = e.script.Eval(rctx, pipe, keys, args...)
			}
		}
		_, _ = pipe.Exec(rctx) // errors are read per command
		return cmds
	}
	cmds := exec(true)
	for _, c := range cmds {
		if redis.HasErrorPrefix(c.Err(), "NOSCRIPT") {
			cmds = exec(false)
			break
		}
	}
	out := make([]any, len(cmds))
	errs := make([]error, len(cmds))
	for i, c := range cmds {
		if err := c.Err(); err != nil {
			errs[i] = fmt.Errorf("run check scripts: %w", err)
			continue
		}
		out[i] = c.Val()
	}
	return out, errs, nil
}

// roundTrip records one Redis pipeline that started at start.
func (m *engineMetrics) roundTrip(start time.Time) {
	d := time.Since(start)
	m.redisRTT.Observe(d.Seconds())
	if m.rtt != nil {
		m.rtt.Record(d)
	}
}

func (e *Engine) refund(ctx context.Context, g *group, mask string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.budget)
	defer cancel()
	keys, args := g.args("r", g.now, mask)
	if err := e.script.Run(rctx, e.rdb, keys, args...).Err(); err != nil {
		e.m.refunds.WithLabelValues("error").Inc()
		e.log.Warn("refund after a split decision", "key", keys[0], "err", err)
		return
	}
	e.m.refunds.WithLabelValues("ok").Inc()
}

type scriptOut struct {
	allowed bool
	now     time.Time
	mult    float64
	mask    string
	tiers   []TierResult
	took    []int64 // per rule, what a commit took (only when a rule leases)
}

func parseOut(v any, n int) (scriptOut, error) {
	raw, ok := v.([]any)
	if !ok || len(raw) != 4+5*n && len(raw) != 4+6*n {
		return scriptOut{}, fmt.Errorf("check script: answer %T of %d values, want %d (or %d with leases)", v, len(raw), 4+5*n, 4+6*n)
	}
	ints := func(i int) (int64, error) {
		x, ok := raw[i].(int64)
		if !ok {
			return 0, fmt.Errorf("check script: value %d is %T", i, raw[i])
		}
		return x, nil
	}
	var o scriptOut
	a, err := ints(0)
	if err != nil {
		return o, err
	}
	now, err := ints(1)
	if err != nil {
		return o, err
	}
	ms, _ := raw[2].(string)
	mult, err := strconv.ParseFloat(ms, 64)
	if err != nil {
		return o, fmt.Errorf("check script: multiplier %q: %w", ms, err)
	}
	o.mask, _ = raw[3].(string)
	o.allowed, o.now, o.mult = a == 1, time.UnixMilli(now).UTC(), mult
	for i := range n {
		var vals [5]int64
		for j := range vals {
			if vals[j], err = ints(4 + 5*i + j); err != nil {
				return o, err
			}
		}
		t := TierResult{Allowed: vals[0] == 1, Limit: vals[1], Remaining: vals[2],
			ResetAfter: time.Duration(vals[3]) * time.Millisecond}
		if vals[4] < 0 {
			t.RetryAfter = -1
		} else {
			t.RetryAfter = time.Duration(vals[4]) * time.Millisecond
		}
		o.tiers = append(o.tiers, t)
	}
	if len(raw) == 4+6*n {
		o.took = make([]int64, n)
		for i := range n {
			if o.took[i], err = ints(4 + 5*n + i); err != nil {
				return o, err
			}
		}
	}
	return o, nil
}

// finish picks the deciding tier and fills the summary fields of r from r.Tiers.
func finish(r Result, nearRatio float64) Result {
	if r.Scale == 0 {
		r.Scale = 1
	}
	if r.Penalty == 0 {
		r.Penalty = 1
	}
	decide := -1
	if !r.Allowed {
		// The denial the client must wait out longest: Retry-After is honest for all tiers.
		for i, t := range r.Tiers {
			if !t.Allowed && !t.Shadow && (decide < 0 || t.RetryAfter > r.Tiers[decide].RetryAfter) {
				decide = i
			}
		}
	} else {
		room := 2.0
		for pass := 0; pass < 2 && decide < 0; pass++ { // enforced tiers first, then shadow ones
			for i, t := range r.Tiers {
				if (pass == 0) == t.Shadow || t.Limit <= 0 {
					continue
				}
				if rr := float64(t.Remaining) / float64(t.Limit); rr < room {
					decide, room = i, rr
				}
			}
		}
	}
	for _, t := range r.Tiers {
		if !t.Allowed && t.Shadow {
			r.Shadow = true
			if r.ShadowRule == "" {
				r.ShadowRule = t.Rule
			}
		}
	}
	if decide < 0 {
		if r.Tier == "" {
			r.Tier = events.TierPrincipal
		}
		return r
	}
	d := r.Tiers[decide]
	r.Tier, r.Rule, r.Limit, r.Remaining = d.Tier, d.Rule, int(d.Limit), int(max(d.Remaining, 0))
	r.ResetAfter, r.Period, r.Scale, r.Quota = d.ResetAfter, d.Period, d.Scale, int(d.Quota)
	if !r.Allowed {
		r.RetryAfter = max(d.RetryAfter, time.Millisecond)
		// A denial while a penalty shrinks the principal's limits is the penalty's
		// doing: the 429 says "abnormal usage detected", not "slow down".
		if r.Penalty < 1 && d.Tier != events.TierQuota && d.Tier != events.TierIP {
			r.Tier = events.TierPenalty
		}
	}
	r.NearLimit = r.Allowed && d.Limit > 0 && float64(d.Limit-d.Remaining) >= nearRatio*float64(d.Limit)
	return r
}
