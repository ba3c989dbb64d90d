package limiter

import (
	"context"
	"fmt"
	"slices"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// EnvoyAlgorithms runs Floodgate's own algorithms for envoy-configured
// limits that name one (`# floodgate: {algorithm: …}`) with the engine's
// check script, one rule per call, in the envoy call's pipeline: a
// penalized descriptor's state lives in the principal's slot and the script
// applies the penalty as it does on the own path. Safe for concurrent use.
type EnvoyAlgorithms struct {
	rdb    redis.UniversalClient
	script *redis.Script
}

var _ envoyconf.AlgorithmRunner = (*EnvoyAlgorithms)(nil)

// NewEnvoyAlgorithms returns the runner on rdb.
func NewEnvoyAlgorithms(rdb redis.UniversalClient) *EnvoyAlgorithms {
	return &EnvoyAlgorithms{rdb: rdb, script: redis.NewScript(checkSource)}
}

// Queue implements envoyconf.AlgorithmRunner.
func (a *EnvoyAlgorithms) Queue(ctx context.Context, pipe redis.Pipeliner, c *envoyconf.AlgorithmCheck) func(context.Context) (envoyconf.AlgorithmResult, error) {
	g := group{penaltyKey: c.PenaltyKey, penalize: c.PenaltyKey != "", rules: []bound{{
		alg: Algorithm(c.Algorithm), limit: int64(c.Limit), period: c.Period, burst: int64(c.Burst),
		scale: c.Scale, cost: int64(min(c.Hits, 1<<53)), shadow: c.Shadow, keys: []string{c.Key},
	}}}
	if g.penaltyKey == "" {
		g.penaltyKey = c.Key // KEYS[1] is read only with a penalty; this keeps the call on one slot
	}
	keys, args := g.args("c", "", "")
	cmd := a.script.EvalSha(ctx, pipe, keys, args...)
	return func(ctx context.Context) (envoyconf.AlgorithmResult, error) {
		v, err := cmd.Result()
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = a.script.Run(ctx, a.rdb, keys, args...).Result()
		}
		if err != nil {
			return envoyconf.AlgorithmResult{}, fmt.Errorf("%s: %w", c.Algorithm, err)
		}
		o, err := parseOut(v, 1)
		if err != nil {
			return envoyconf.AlgorithmResult{}, err
		}
		t := o.tiers[0]
		return envoyconf.AlgorithmResult{Allowed: t.Allowed, Limit: t.Limit, Remaining: t.Remaining,
			ResetAfter: t.ResetAfter, Penalty: o.mult}, nil
	}
}

// envoyQuota is a principal's daily quota, checked and consumed in an envoy
// call's pipeline as the own path's check script does it (all or nothing
// for the quota alone), and refunded when the call is denied after all.
type envoyQuota struct {
	e     *Engine
	g     group
	units int64
	cmd   *redis.Cmd
}

// envoyQuota binds p's daily quota for a call of units; nil when p has none.
func (e *Engine) envoyQuota(p events.Principal, units int64) *envoyQuota {
	rs := e.rules.Rules()
	plan, pov, plov, _ := e.overridesFor(p, "")
	qb, ok := e.quotaBound(rs, p, plan, plov, pov, units, time.Time{})
	if !ok {
		return nil
	}
	return &envoyQuota{e: e, units: units, g: group{penaltyKey: e.prefix + redisx.PenaltyKey(string(p.Kind), p.ID),
		rules: []bound{qb}, now: e.nowArg()}}
}

// queue is envoyconf.Request.Also.
func (q *envoyQuota) queue(ctx context.Context, pipe redis.Pipeliner) {
	keys, args := q.g.args("c", q.g.now, "")
	q.cmd = q.e.script.EvalSha(ctx, pipe, keys, args...)
}

// quotaAnswer is the quota's verdict on one call.
type quotaAnswer struct {
	id         string
	allowed    bool // within the quota (or a shadow quota, which never denies)
	wouldDeny  bool // exhausted: denies, or in shadow would have
	limit      int64
	remaining  int64
	resetAfter time.Duration
	consumed   string // the script's mask: "1" when the units were taken
	units      int64
}

// read is the quota's answer once the pipeline ran; a quota Redis could
// not answer follows its fail policy (closed denies, open and local allow).
func (q *envoyQuota) read(ctx context.Context) (quotaAnswer, error) {
	b := q.g.rules[0]
	v, err := q.cmd.Result()
	if redis.HasErrorPrefix(err, "NOSCRIPT") {
		keys, args := q.g.args("c", q.g.now, "")
		v, err = q.e.script.Run(ctx, q.e.rdb, keys, args...).Result()
	}
	var o scriptOut
	if err == nil {
		o, err = parseOut(v, 1)
	}
	if err != nil {
		a := quotaAnswer{id: b.id, allowed: b.fail != FailClosed || b.shadow, wouldDeny: b.fail == FailClosed, limit: b.limit, units: q.units}
		return a, fmt.Errorf("daily quota %s: %w", b.id, err)
	}
	t := o.tiers[0]
	return quotaAnswer{id: b.id, allowed: t.Allowed || b.shadow, wouldDeny: !t.Allowed, limit: t.Limit,
		remaining: max(t.Remaining, 0), resetAfter: t.ResetAfter, consumed: o.mask, units: q.units}, nil
}

// refund gives the units back when the call was denied by another limit.
func (q *envoyQuota) refund(ctx context.Context, mask string) { q.e.refund(ctx, &q.g, mask) }

// decide puts the quota's verdict in the call's decision event: the units
// it counted, and a denial (or, for a shadow quota, a would-be denial) as
// the quota's — the denial a client waits out longest, until the UTC day
// ends, as finish picks it on the own path.
func (a *quotaAnswer) decide(ev *events.Decision) {
	ev.Cost = min(max(a.units, 1), 1_000_000)
	if !a.wouldDeny {
		return
	}
	if a.allowed {
		ev.Shadow = true
		if ev.Rule == "" {
			ev.Rule = a.id
		}
		return
	}
	ev.Tier, ev.Rule, ev.Limit, ev.Remaining, ev.NearLimit = events.TierQuota, a.id, a.limit, 0, false
}

// envoyUnits is what a call counts against the principal's daily quota: the
// hits of the principal's own descriptor (its hits_addend, else the
// call's).
func envoyUnits(req *envoyconf.Request, tiers []events.Tier) int64 {
	hits := uint64(max(req.HitsAddend, 1))
	if i := slices.Index(tiers, events.TierPrincipal); i >= 0 && req.Descriptors[i].HitsAddend != nil {
		hits = *req.Descriptors[i].HitsAddend
	}
	return int64(min(hits, 1_000_000))
}
