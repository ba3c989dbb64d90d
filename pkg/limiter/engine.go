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

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
	"github.com/sony/gobreaker/v2"

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
}

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
	Tiers      []TierResult
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
	// The Redis breaker opens when, within one second, at least
	// BreakerFailures checks failed and they were at least half of the
	// checks (a ratio, so one short stall under load does not open it for
	// everybody); it stays open BreakerOpen (default 200ms), then lets up to 5
	// probes through. While open, checks answer from fail policies without
	// calling Redis.
	BreakerFailures uint32
	BreakerOpen     time.Duration
	// QueueWait bounds how long a check may wait for a pipeline before it is
	// shed (default 4 × Budget): the Redis budget counts Redis time, not
	// queue time, and a limiter past its capacity sheds instead of
	// failing open.
	QueueWait time.Duration
	// OverLimitEntries bounds the over-limit cache; 0 disables it.
	OverLimitEntries int
	// LocalBuckets bounds the in-process buckets of the "local" fail policy.
	LocalBuckets int
	// RedisBatch bounds how many concurrent checks share one pipelined Redis
	// write (FLOODGATE_LIMITER_REDIS_BATCH); 0 = 64, 1 = every check on its own.
	RedisBatch int
	// Shadow puts every rule in shadow mode (FLOODGATE_LIMITER_SHADOW).
	Shadow   bool
	Logger   *slog.Logger
	Registry prometheus.Registerer
}

// Engine runs checks. It is safe for concurrent use.
type Engine struct {
	rdb          redis.UniversalClient
	script       *redis.Script
	rules        RuleSource
	rt           *Runtime
	clock        func() time.Time
	queueWait    time.Duration
	lastRedisErr atomic.Value // string: the latest Redis error, logged when the breaker opens
	budget       time.Duration
	breaker      *gobreaker.CircuitBreaker[[]any]
	overLimit    *overLimitCache
	local        *localBuckets
	log          *slog.Logger
	m            *engineMetrics
	shadow       bool
	batch        *scriptBatcher // nil: one Redis call per check
	fixedNow     func() int64   // tests only: a fixed time for the script instead of Redis TIME
}

type engineMetrics struct {
	redisErrors prometheus.Counter
	breakerOpen prometheus.Gauge
	cacheHits   prometheus.Counter
	degraded    *prometheus.CounterVec
	refunds     *prometheus.CounterVec
	shed        prometheus.Counter
}

// NewEngine returns an engine; Load the script before serving.
func NewEngine(c EngineConfig) (*Engine, error) {
	if c.Redis == nil || c.Rules == nil {
		return nil, errors.New("new engine: Redis and Rules are required")
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
	if c.BreakerOpen <= 0 {
		c.BreakerOpen = 200 * time.Millisecond
	}
	if c.QueueWait <= 0 {
		c.QueueWait = 4 * c.Budget
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
		redisErrors: f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_redis_errors_total", Help: "Checks whose Redis round trip failed or timed out."}),
		breakerOpen: f.NewGauge(prometheus.GaugeOpts{Name: "floodgate_limiter_breaker_open", Help: "1 while the Redis circuit breaker is open (or half-open)."}),
		cacheHits:   f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_overlimit_cache_hits_total", Help: "Checks denied by the local over-limit cache without calling Redis."}),
		degraded:    f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_degraded_total", Help: "Tier answers given by a fail policy, by policy and outcome."}, []string{"policy", "outcome"}),
		refunds:     f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_refunds_total", Help: "Compensating refunds after the IP and principal groups disagreed, by result."}, []string{"result"}),
		shed:        f.NewCounter(prometheus.CounterOpts{Name: "floodgate_limiter_shed_total", Help: "Checks answered from local state because the limiter was past its capacity (pipeline queue full or too slow)."}),
	}
	e := &Engine{
		rdb: c.Redis, script: redis.NewScript(checkSource), rules: c.Rules, rt: c.Runtime, clock: c.Clock,
		budget: c.Budget, queueWait: c.QueueWait, shadow: c.Shadow, local: newLocalBuckets(c.LocalBuckets), log: c.Logger, m: m,
	}
	if c.RedisBatch == 0 {
		c.RedisBatch = 64
	}
	if c.RedisBatch > 1 {
		e.batch = &scriptBatcher{rdb: c.Redis, script: e.script, max: c.RedisBatch, maxFlushers: 4, budget: c.Budget,
			maxQueue: 16 * c.RedisBatch}
	}
	if c.OverLimitEntries > 0 {
		e.overLimit = newOverLimitCache(c.OverLimitEntries)
	}
	e.breaker = gobreaker.NewCircuitBreaker[[]any](gobreaker.Settings{
		Name:        "redis",
		MaxRequests: 5,
		Interval:    time.Second, // counts are per second while closed
		Timeout:     c.BreakerOpen,
		ReadyToTrip: func(cnt gobreaker.Counts) bool { return tripRatio(cnt, c.BreakerFailures) },
		// A caller that went away, or a check shed by the queue, says nothing
		// about Redis.
		IsExcluded: func(err error) bool { return errors.Is(err, context.Canceled) || errors.Is(err, errOverloaded) },
		OnStateChange: func(_ string, from, to gobreaker.State) {
			open := 0.0
			if to != gobreaker.StateClosed {
				open = 1
			}
			m.breakerOpen.Set(open)
			if to == gobreaker.StateOpen {
				cause, _ := e.lastRedisErr.Load().(string)
				c.Logger.Warn("redis circuit breaker opened", "from", from.String(), "open_for", c.BreakerOpen, "cause", cause)
			} else {
				c.Logger.Info("redis circuit breaker", "from", from.String(), "to", to.String())
			}
		},
	})
	return e, nil
}

// Load puts the script in Redis's cache (every master of a cluster) so the first
// checks skip the NOSCRIPT fallback.
func (e *Engine) Load(ctx context.Context) error {
	if cc, ok := e.rdb.(*redis.ClusterClient); ok {
		return cc.ForEachMaster(ctx, func(ctx context.Context, c *redis.Client) error {
			return e.script.Load(ctx, c).Err()
		})
	}
	return e.script.Load(ctx, e.rdb).Err()
}

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
	keys   []string
	days   []int64 // day numbers of keys, for the daily quota
}

// group is the rules of one hash tag: one script call.
type group struct {
	penaltyKey string
	penalize   bool
	rules      []bound
}

func (g *group) args(mode string, now string, mask string) ([]string, []any) {
	keys := make([]string, 0, len(g.rules)+2)
	keys = append(keys, g.penaltyKey)
	args := make([]any, 0, 5+9*len(g.rules))
	pen := "0"
	if g.penalize {
		pen = "1"
	}
	args = append(args, mode, now, pen, mask, len(g.rules))
	for _, b := range g.rules {
		shadow := "0"
		if b.shadow {
			shadow = "1"
		}
		keys = append(keys, b.keys...)
		args = append(args, b.alg.code(), b.limit, b.period.Milliseconds(), b.burst,
			strconv.FormatFloat(b.scale, 'g', -1, 64), b.cost, shadow, len(b.keys))
		for _, d := range b.days {
			args = append(args, d)
		}
	}
	return keys, args
}

// bind resolves the rules that apply to req.
func (e *Engine) bind(rs *Ruleset, req Request) (principal, ip group, cost int64) {
	kind, id := string(req.Principal.Kind), req.Principal.ID
	var pov, plov *Override
	var scales Scales
	if e.rt != nil {
		ov := e.rt.Overrides()
		pov = ov.Principal(req.Principal)
		scales = e.rt.Scales()
		plan := req.Plan
		if plan == "" && pov != nil {
			plan = pov.Plan
		}
		req.Plan = plan
		plov = ov.Plan(plan)
	}
	if req.Plan == "" {
		req.Plan = DefaultPlan
	}
	cost = int64(max(req.Cost, 1)) * int64(rs.Cost(req.Method, req.Route))
	resType, _, _ := strings.Cut(req.Resource, ":")

	principal = group{penaltyKey: redisx.PenaltyKey(kind, id), penalize: true}
	var ipID string
	for i := range rs.Rules {
		r := &rs.Rules[i]
		if !r.Matches(req.Principal.Kind, req.Plan, req.Method, req.Route, resType) {
			continue
		}
		b := bound{id: r.ID, tier: r.Tier, alg: r.Algorithm, limit: int64(r.Limit), period: r.Period,
			burst: int64(r.Burst), cost: cost, shadow: r.Shadow || rs.Shadow || e.shadow, fail: r.Fail,
			scale: scales.For(r.Tier, req.Method, req.Route)}
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
			b.keys = []string{redisx.BucketKey("ip", ipID, sub)}
			ip.rules = append(ip.rules, b)
			continue
		case events.TierResource:
			sub += "|" + req.Resource
		}
		b.keys = []string{redisx.BucketKey(kind, id, sub)}
		principal.rules = append(principal.rules, b)
	}
	if ipID != "" {
		ip.penaltyKey = redisx.PenaltyKey("ip", ipID) // never written: keeps KEYS[1] on the IP's slot
	}

	q := rs.Quota(req.Principal.Kind, req.Plan)
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
				qb = bound{id: "quota-" + kind + "-" + req.Plan, shadow: rs.Shadow || e.shadow, fail: FailOpen}
			}
		}
	}
	if limit > 0 {
		qb.tier, qb.alg, qb.limit, qb.period, qb.scale, qb.cost = events.TierQuota, dayQuota, limit, 24*time.Hour, 1, cost
		now := e.clock().UTC()
		for _, t := range []time.Time{now.Add(-10 * time.Minute), now.Add(10 * time.Minute)} {
			day := t.Unix() / 86400
			if len(qb.days) > 0 && qb.days[len(qb.days)-1] == day {
				continue
			}
			qb.days = append(qb.days, day)
			qb.keys = append(qb.keys, redisx.DayUsageKey(kind, id, t.Format(time.DateOnly)))
		}
		principal.rules = append(principal.rules, qb)
	}
	return principal, ip, cost
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
// It returns an error only for a request it cannot evaluate; Redis failures are
// answered by the rules' fail policies with Result.Degraded set.
func (e *Engine) Check(ctx context.Context, req Request) (Result, error) {
	rs := e.rules.Rules()
	pg, ig, cost := e.bind(rs, req)
	groups := make([]*group, 0, 2)
	if len(pg.rules) > 0 {
		groups = append(groups, &pg)
	}
	if len(ig.rules) > 0 {
		groups = append(groups, &ig)
	}
	if len(groups) == 0 {
		return Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1, Scale: 1, Now: e.clock().UTC(), Cost: int(cost)}, nil
	}
	if r, ok := e.fromOverLimitCache(groups, cost); ok {
		e.m.cacheHits.Inc()
		return finish(r, rs.NearLimit), nil
	}

	raw, err := e.breaker.Execute(func() ([]any, error) {
		// The pipeline's own budget bounds Redis time; this bound adds the
		// longest a check may queue for a pipeline.
		wait := e.budget
		if e.batch != nil {
			wait += e.queueWait
		}
		rctx, cancel := context.WithTimeout(ctx, wait)
		defer cancel()
		return e.run(rctx, groups)
	})
	if err != nil {
		if ctx.Err() != nil {
			return Result{}, fmt.Errorf("check %s: %w", req.Principal.Key(), ctx.Err())
		}
		if errors.Is(err, errOverloaded) {
			// Busy is not down: answered from local state — the over-limit
			// cache above and this instance's local buckets — never open.
			e.m.shed.Inc()
			return finish(e.shed(groups, cost), rs.NearLimit), nil
		}
		e.m.redisErrors.Inc()
		reason := "redis unavailable"
		if errors.Is(err, gobreaker.ErrOpenState) || errors.Is(err, gobreaker.ErrTooManyRequests) {
			reason = "redis circuit open"
		} else {
			e.lastRedisErr.Store(err.Error())
		}
		return finish(e.degrade(groups, cost, reason), rs.NearLimit), nil
	}

	res := Result{Allowed: true, Penalty: 1, Cost: int(cost)}
	outs := make([]scriptOut, len(groups))
	for i, g := range groups {
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
		for j, t := range o.tiers {
			b := g.rules[j]
			t.Rule, t.Tier, t.Algorithm, t.Shadow, t.Period, t.Scale = b.id, b.tier, b.alg, b.shadow, b.period, b.scale
			if !t.Allowed && t.RetryAfter < 0 {
				t.RetryAfter = max(t.ResetAfter, b.period) // cannot fit at this limit
			}
			res.Tiers = append(res.Tiers, t)
			if !t.Allowed && !t.Shadow && e.overLimit != nil && t.RetryAfter > 0 {
				e.overLimit.put(b.keys[0], b.sig(), t, o.mult, cost, e.clock().Add(t.RetryAfter))
			}
		}
	}
	// The IP group and the principal group each commit all or nothing; when one
	// committed and the other denied, give the committed units back.
	if !res.Allowed && len(groups) == 2 {
		for i, g := range groups {
			if outs[i].allowed && strings.Contains(outs[i].mask, "1") {
				e.refund(ctx, g, outs[i].mask)
			}
		}
	}
	return finish(res, rs.NearLimit), nil
}

func (e *Engine) nowArg() string {
	if e.fixedNow != nil {
		return strconv.FormatInt(e.fixedNow(), 10)
	}
	return ""
}

// run sends one script call per group in one pipelined round trip (EVALSHA,
// falling back to EVAL when a node answers NOSCRIPT).
func (e *Engine) run(ctx context.Context, groups []*group) ([]any, error) {
	now := e.nowArg()
	if e.batch != nil {
		calls := make([]scriptCall, len(groups))
		for i, g := range groups {
			calls[i].keys, calls[i].args = g.args("c", now, "")
		}
		return e.batch.run(ctx, calls)
	}
	if len(groups) == 1 {
		keys, args := groups[0].args("c", now, "")
		v, err := e.script.Run(ctx, e.rdb, keys, args...).Result()
		if err != nil {
			return nil, fmt.Errorf("run check script: %w", err)
		}
		return []any{v}, nil
	}
	exec := func(sha bool) ([]*redis.Cmd, error) {
		pipe := e.rdb.Pipeline()
		cmds := make([]*redis.Cmd, len(groups))
		for i, g := range groups {
			keys, args := g.args("c", now, "")
			if sha {
				cmds[i] = e.script.EvalSha(ctx, pipe, keys, args...)
			} else {
				cmds[i] = e.script.Eval(ctx, pipe, keys, args...)
			}
		}
		_, err := pipe.Exec(ctx)
		return cmds, err
	}
	cmds, err := exec(true)
	if err != nil && redis.HasErrorPrefix(err, "NOSCRIPT") {
		cmds, err = exec(false)
	}
	if err != nil {
		return nil, fmt.Errorf("run check scripts: %w", err)
	}
	out := make([]any, len(cmds))
	for i, c := range cmds {
		out[i] = c.Val()
	}
	return out, nil
}

func (e *Engine) refund(ctx context.Context, g *group, mask string) {
	rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), e.budget)
	defer cancel()
	keys, args := g.args("r", e.nowArg(), mask)
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
}

func parseOut(v any, n int) (scriptOut, error) {
	raw, ok := v.([]any)
	if !ok || len(raw) != 4+5*n {
		return scriptOut{}, fmt.Errorf("check script: answer %T of %d values, want %d", v, len(raw), 4+5*n)
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
	r.ResetAfter, r.Period, r.Scale = d.ResetAfter, d.Period, d.Scale
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

// tripRatio opens the breaker when at least minFailures checks failed within
// the counting interval and they were at least half of the checks.
func tripRatio(cnt gobreaker.Counts, minFailures uint32) bool {
	return cnt.TotalFailures >= minFailures && cnt.TotalFailures*2 >= cnt.Requests
}
