package limiter

import (
	"context"
	_ "embed"
	"errors"
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

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
	if prio == admission.PriorityUnset {
		prio = rs.Priority(req.Method, req.Route)
		req.Priority = prio
	}
	if pastDeadline(req.Deadline) || ctx.Err() != nil { // the caller has given up or gone: spend nothing
		return Result{Priority: prio}, ErrPastDeadline
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
	// At a step of a gradual rollout the candidate answers for the
	// principals in its slice: both are still judged, and the candidate's
	// verdict becomes the answer (the enforced one's when the candidate
	// could not be asked, or when the enforced rules could not be judged).
	var cand *Candidate
	var verdict chan candidateVerdict
	answers := false
	if e.cands != nil {
		if cand = e.cands.Candidate(); cand != nil {
			answers = cand.Enforces(req.Principal)
			verdict = make(chan candidateVerdict, 1)
			creq := req // the goroutine's own copy: req stays on the stack without a candidate
			go func() { verdict <- e.checkCandidate(ctx, cand, creq, answers) }()
		}
	}
	res, err := e.check(ctx, rs, req)
	res.Priority, res.Utilization, res.RulesVersion = prio, status, rs.Version
	judged := err == nil && !res.Degraded // a fail policy's answer says nothing about the rules
	if verdict != nil {
		v := <-verdict
		switch {
		case v.ok && judged:
			parentBlocked := !res.Allowed
			if answers {
				res = v.res
				res.Priority, res.Utilization, res.RulesVersion = prio, status, cand.Version
			}
			res.CandidateVersion, res.CandidateBlocked = cand.Version, v.blocked
			if cand.Impact != nil {
				cand.Impact.Add(prio, v.blocked)
				cand.Impact.AddPaired(prio, req, res.Plan, v.blocked, parentBlocked, answers)
			}
		case !v.ok && cand.Impact != nil:
			cand.Impact.AddError()
		}
	}
	if rs.Impact != nil && judged {
		rs.Impact.Add(prio, !res.Allowed)
	}
	return res, err
}

// check runs the rules for one admitted request, in stages: bind the rules
// to the request, answer from local state when it knows (fromCache), admit
// each group to its shard (admit), call Redis (runShards), settle each
// shard's outcome with its breaker and admission limit (settle), apply
// Redis's answers (apply), answer the rest without it (withoutRedis) and give
// back what one group took when the whole was denied (refundSplit).
func (e *Engine) check(ctx context.Context, rs *Ruleset, req Request) (Result, error) {
	sc := new(checkScratch)
	var cost int64
	var plan string
	sc.pg, sc.ig, cost, plan = e.bind(rs, req)
	// The local clock of the over-limit cache and the local buckets: the
	// decision's own time in a replay, so nothing of a replay follows the
	// wall clock (a cache entry held "until" wall time would deny a replayed
	// request its event time allows); the engine's clock, read when used,
	// otherwise (localNow).
	groups := sc.groups[:0]
	if len(sc.pg.rules) > 0 {
		groups = append(groups, &sc.pg)
	}
	if len(sc.ig.rules) > 0 {
		groups = append(groups, &sc.ig)
	}
	if len(groups) == 0 {
		return Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1, Scale: 1, Now: e.localNow(req.At).UTC(), Cost: int(cost), Plan: plan}, nil
	}
	if r, ok := e.fromCache(groups, cost, plan, req.At); ok {
		return finish(r, rs.NearLimit), nil
	}
	calls, raw, errs := sc.calls[:len(groups)], sc.raw[:len(groups)], sc.errs[:len(groups)]
	critical := req.Priority == admission.PriorityCritical // never queued, sent first (admit, runShards)
	remote, admitted, canceled := e.admit(ctx.Done(), groups, calls, req.Deadline, critical)
	if admitted.IsZero() { // no clock read of admit's to go by
		admitted = time.Now()
	}
	switch {
	case canceled: // the caller went away while it waited for a permit
		for i := range errs {
			errs[i] = context.Canceled
		}
	case !req.Deadline.IsZero() && !admitted.Before(req.Deadline): // it waited for a permit past the caller's deadline
		for i := range errs {
			errs[i] = ErrPastDeadline
		}
	case remote > 0:
		e.runShards(ctx, groups, calls, raw, errs, req.Deadline, critical)
	}
	if err := e.settle(ctx, calls, errs); err != nil {
		if errors.Is(err, ErrPastDeadline) {
			return Result{}, ErrPastDeadline
		}
		return Result{}, fmt.Errorf("check %s: %w", req.Principal.Key(), err)
	}
	if canceled { // no group was admitted: nothing was settled to say so
		return Result{}, fmt.Errorf("check %s: %w", req.Principal.Key(), context.Canceled)
	}
	outs := sc.outs[:len(groups)]
	res, err := e.apply(groups, calls, raw, outs, cost, plan, req.At)
	if err != nil {
		return Result{}, fmt.Errorf("check %s: %w", req.Principal.Key(), err)
	}
	e.withoutRedis(&res, groups, calls, cost, req.At)
	e.refundSplit(ctx, &res, groups, calls, outs)
	return finish(res, rs.NearLimit), nil
}

// fromCache answers without Redis when local state knows: a key the
// over-limit cache holds as over its limit, or leases that cover every rule
// (asking for more leases when they run low).
func (e *Engine) fromCache(groups []*group, cost int64, plan string, at time.Time) (Result, bool) {
	if r, ok := e.fromOverLimitCache(groups, cost, e.localNow(at)); ok {
		e.m.cacheHits.Inc()
		r.Plan = plan
		return r, true
	}
	if e.hasLeases(groups) { // one clock read for both; checks without leases skip them
		now := e.clock()
		if r, ok := e.fromLeases(groups, plan, now); ok {
			return r, true
		}
		e.askLeases(groups, now)
	}
	return Result{}, false
}

// checkScratch is what a check keeps per group — two at most, the
// principal's and the IP's — in one allocation.
type checkScratch struct {
	pg, ig group
	groups [2]*group
	calls  [2]shardCall
	raw    [2]any
	errs   [2]error
	outs   [2]scriptOut
}

// admit admits each group to its shard — once per shard when both groups
// share one: the breaker first (a failing shard costs nothing), then the
// shard's adaptive concurrency limit, waiting for a permit in its queue at
// most until deadline (zero: none) and while its caller waits (gone: the
// caller's ctx.Done()) — into calls, one per group. remote counts the groups
// Redis will be asked about; at is when the last of them was admitted (zero:
// none was); canceled, whether the caller went away while a permit was
// awaited. A CRITICAL check (critical) is never queued: it takes a permit
// past the limit, as at the gRPC entry gate.
func (e *Engine) admit(gone <-chan struct{}, groups []*group, calls []shardCall, deadline time.Time, critical bool) (remote int, at time.Time, canceled bool) {
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
		outcome := admission.Admitted
		if critical {
			c.sh.adm.Take()
		} else {
			outcome = c.sh.adm.AcquireWait(gone, deadline)
		}
		switch outcome {
		case admission.Admitted:
		case admission.PastDeadline:
			done(ErrPastDeadline)
			c.local = localShed // never answered: check ends with ErrPastDeadline
			continue
		case admission.Canceled:
			done(context.Canceled)
			c.local, canceled = localShed, true // never answered: check ends with context.Canceled
			continue
		default:
			done(errOverloaded)
			c.local = localShed
			continue
		}
		at = time.Now()
		c.done, c.start = done, at
		remote++
	}
	return remote, at, canceled
}

// settle tells each shard's breaker and admission limit its outcome, once
// per shard, and marks the groups Redis did not answer with why. It returns
// ErrPastDeadline when a call was not sent because its caller's deadline had
// passed, the context's error when the caller went away.
func (e *Engine) settle(ctx context.Context, calls []shardCall, errs []error) error {
	var canceled error
	for _, err := range errs {
		if errors.Is(err, ErrPastDeadline) {
			canceled = ErrPastDeadline
		}
	}
	for i := range calls {
		c := &calls[i]
		if c.done == nil {
			continue
		}
		c.sh.adm.Release(c.start)
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
		case errors.Is(err, errOverloaded), errors.Is(err, ErrPastDeadline):
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
	return canceled
}

// apply reads Redis's answers into the result — its tiers, penalty and time
// — and into outs, one per group; and teaches local state what Redis said:
// the over-limit cache, the leases, and the local buckets a shed or
// degraded answer continues from.
func (e *Engine) apply(groups []*group, calls []shardCall, raw []any, outs []scriptOut, cost int64, plan string, at time.Time) (Result, error) {
	res := Result{Allowed: true, Penalty: 1, Cost: int(cost), Plan: plan}
	for i, g := range groups {
		if calls[i].local != 0 {
			continue
		}
		o, err := parseOut(raw[i], len(g.rules))
		if err != nil {
			return Result{}, err
		}
		outs[i] = o
		res.Allowed = res.Allowed && o.allowed
		if g.penalize {
			res.Penalty = o.mult
		}
		res.Now = o.now
		n := e.instances.Load()
		now := e.localNow(at)
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
	return res, nil
}

// withoutRedis answers the groups Redis did not: from local state when the
// limiter was past its capacity (shed), else by the rules' fail policies.
func (e *Engine) withoutRedis(res *Result, groups []*group, calls []shardCall, cost int64, at time.Time) {
	var local []*group
	for i, g := range groups {
		if calls[i].local != 0 {
			local = append(local, g)
		}
	}
	if len(local) == 0 {
		return
	}
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
		lr = e.shed(local, cost, e.localNow(at))
	default:
		e.m.redisErrors.Inc()
		reason := "redis unavailable"
		for i := range calls {
			if calls[i].local == localOutage {
				reason = "redis circuit open"
			}
		}
		lr = e.degrade(local, cost, reason, e.localNow(at))
	}
	res.Allowed = res.Allowed && lr.Allowed
	res.Degraded, res.Error = true, lr.Error
	res.Tiers = append(res.Tiers, lr.Tiers...)
	if res.Now.IsZero() {
		res.Now = lr.Now
	}
}

// refundSplit keeps a decision all or nothing across groups: each group
// commits all or nothing, so when one committed and the whole was denied
// (another group denied, in Redis or locally), the committed units go back.
func (e *Engine) refundSplit(ctx context.Context, res *Result, groups []*group, calls []shardCall, outs []scriptOut) {
	if res.Allowed || len(groups) != 2 {
		return
	}
	for i, g := range groups {
		if calls[i].local == 0 && outs[i].allowed && strings.Contains(outs[i].mask, "1") {
			e.refund(ctx, g, outs[i].mask)
		}
	}
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

// runShards sends the admitted groups' script calls, one pipeline per shard
// (concurrently when they are on two shards), and fills raw and errs per group.
// The wait counts Redis time (each pipeline's own budget) plus the longest a
// check may queue for a pipeline: the batcher's bound (a timer only while
// the check waits for another caller's pipeline), or run's own context
// unbatched (wait is its budget then). No context of its own per check:
// its timer, cancel context and Done channel were 4 % of the limiter's CPU
// in the pinned HTTP peerbench, the batcher's timer alone 1 %
// (docs/benchmarks.md). A CRITICAL check's calls go out first (urgent:
// scriptBatcher.run).
func (e *Engine) runShards(ctx context.Context, groups []*group, calls []shardCall, raw []any, errs []error, deadline time.Time, urgent bool) {
	wait := e.budget
	if e.batching {
		wait += e.queueWait
	}
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
		out, perr, err := e.run(ctx, shards[k], gs, deadline, wait, urgent)
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
