package limiter

import (
	"context"
	_ "embed"
	"fmt"
	"strconv"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

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

// args is the script call of g: its keys and arguments. An int64 or a
// non-constant string held in an interface is an allocation of its own, so
// the arguments are pointers into one array of numbers and one of strings
// (go-redis writes *int64 and *string as their values): three allocations
// a call, however many rules.
func (g *group) args(mode string, now string, mask string) ([]string, []any) {
	nkeys, ndays := 1, 0
	for i := range g.rules {
		nkeys, ndays = nkeys+len(g.rules[i].keys), ndays+len(g.rules[i].days)
	}
	keys := make([]string, 0, nkeys)
	keys = append(keys, g.penaltyKey)
	args := make([]any, 0, 5+9*len(g.rules)+ndays)
	nums := make([]int64, 0, 1+7*len(g.rules)+ndays)
	strs := make([]string, 0, 4+3*len(g.rules))
	num := func(v int64) any { nums = append(nums, v); return &nums[len(nums)-1] }
	str := func(v string) any { strs = append(strs, v); return &strs[len(strs)-1] }
	if mode == "c" && g.replay {
		mode = "p" // a check on a replay's clock: check.lua keeps its keys ReplayKeyTTL at least
	}
	args = append(args, str(mode), str(now), str(flag(g.penalize)), str(mask), num(int64(len(g.rules))))
	for _, b := range g.rules {
		keys = append(keys, b.keys...)
		scale := "1"
		if b.scale != 1 {
			scale = strconv.FormatFloat(b.scale, 'g', -1, 64)
		}
		args = append(args, str(b.alg.code()), num(b.limit), num(b.period.Milliseconds()), num(b.burst),
			str(scale), num(b.cost), str(flag(b.shadow)), num(b.lease), num(int64(len(b.keys))))
		for _, d := range b.days {
			args = append(args, num(d))
		}
	}
	return keys, args
}

// flag is a boolean argument of the script: "1" or "0".
func flag(b bool) string {
	if b {
		return "1"
	}
	return "0"
}

func (e *Engine) nowArg() string {
	if e.fixedNow != nil {
		return strconv.FormatInt(e.fixedNow(), 10)
	}
	return ""
}

// run sends one script call per group to one shard in one pipelined round
// trip (EVALSHA, falling back to EVAL when a node answers NOSCRIPT): through
// the shard's batcher, shared with concurrent checks, or on its own. It
// returns one answer and one error per group, or an error for all. wait
// bounds a batched call's time in the batcher (0: ctx alone does);
// unbatched, ctx and the budget bound the round trip. An urgent call goes
// ahead of the batched calls waiting (scriptBatcher.run).
func (e *Engine) run(ctx context.Context, sh *shard, groups []*group, deadline time.Time, wait time.Duration, urgent bool) ([]any, []error, error) {
	if sh.batch != nil {
		it := newBatchItem(len(groups), deadline)
		for i, g := range groups {
			it.calls[i].keys, it.calls[i].args = g.args("c", g.now, "")
		}
		return sh.batch.run(ctx, it, wait, urgent)
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

// OneRule is one rule run by the check script outside a check: a limit of
// an envoy ratelimit configuration that names a Floodgate algorithm
// (pkg/limiter/envoyrls), with the penalty of its principal's slot.
type OneRule struct {
	Algorithm Algorithm
	Limit     int64
	Period    time.Duration
	Burst     int64
	Scale     float64
	Cost      int64
	Shadow    bool
	Key       string
}

// ScriptRunner runs single rules with the engine's check script, one call
// per rule in the caller's pipeline. Safe for concurrent use.
type ScriptRunner struct {
	rdb    redis.UniversalClient
	script *redis.Script
}

// NewScriptRunner returns a runner on rdb.
func NewScriptRunner(rdb redis.UniversalClient) *ScriptRunner {
	return &ScriptRunner{rdb: rdb, script: redis.NewScript(checkSource)}
}

// Queue queues r's call in pipe — under penaltyKey's penalty, none when it
// is "" — and returns the function that reads its answer once the pipeline
// ran: the rule's result and the penalty multiplier.
func (s *ScriptRunner) Queue(ctx context.Context, pipe redis.Pipeliner, penaltyKey string, r OneRule) func(context.Context) (TierResult, float64, error) {
	g := group{penaltyKey: penaltyKey, penalize: penaltyKey != "", rules: []bound{{
		alg: r.Algorithm, limit: r.Limit, period: r.Period, burst: r.Burst,
		scale: r.Scale, cost: r.Cost, shadow: r.Shadow, keys: []string{r.Key},
	}}}
	if g.penaltyKey == "" {
		g.penaltyKey = r.Key // KEYS[1] is read only with a penalty; this keeps the call on one slot
	}
	keys, args := g.args("c", "", "")
	cmd := s.script.EvalSha(ctx, pipe, keys, args...)
	return func(ctx context.Context) (TierResult, float64, error) {
		v, err := cmd.Result()
		if redis.HasErrorPrefix(err, "NOSCRIPT") {
			v, err = s.script.Run(ctx, s.rdb, keys, args...).Result()
		}
		if err != nil {
			return TierResult{}, 0, fmt.Errorf("%s: %w", r.Algorithm, err)
		}
		o, err := parseOut(v, 1)
		if err != nil {
			return TierResult{}, 0, err
		}
		return o.tiers[0], o.mult, nil
	}
}

// QuotaCall is a principal's daily quota, checked and consumed in a
// caller's pipeline as a check does it (all or nothing for the quota alone),
// and refunded when the call is denied after all: an envoy-configured
// call's quota (pkg/limiter/envoyrls).
type QuotaCall struct {
	e     *Engine
	g     group
	units int64
	cmd   *redis.Cmd
}

// QuotaCall binds p's daily quota for a call of units; nil when p has none.
func (e *Engine) QuotaCall(p events.Principal, units int64) *QuotaCall {
	rs := e.rules.Rules()
	plan, pov, plov, _ := e.overridesFor(p, "")
	qb, ok := e.quotaBound(rs, p, plan, plov, pov, units, time.Time{})
	if !ok {
		return nil
	}
	return &QuotaCall{e: e, units: units, g: group{penaltyKey: e.prefix + redisx.PenaltyKey(string(p.Kind), p.ID),
		rules: []bound{qb}, now: e.nowArg()}}
}

// Queue queues the quota's call in pipe (envoyconf.Request.Also).
func (q *QuotaCall) Queue(ctx context.Context, pipe redis.Pipeliner) {
	keys, args := q.g.args("c", q.g.now, "")
	q.cmd = q.e.script.EvalSha(ctx, pipe, keys, args...)
}

// QuotaAnswer is the quota's verdict on one call.
type QuotaAnswer struct {
	ID         string
	Allowed    bool // within the quota (or a shadow quota, which never denies)
	WouldDeny  bool // exhausted: denies, or in shadow would have
	Limit      int64
	Remaining  int64
	ResetAfter time.Duration
	Consumed   string // the script's mask: "1" when the units were taken
	Units      int64
}

// Read is the quota's answer once the pipeline ran; a quota Redis could
// not answer follows its fail policy (closed denies, open and local allow).
func (q *QuotaCall) Read(ctx context.Context) (QuotaAnswer, error) {
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
		a := QuotaAnswer{ID: b.id, Allowed: b.fail != FailClosed || b.shadow, WouldDeny: b.fail == FailClosed, Limit: b.limit, Units: q.units}
		return a, fmt.Errorf("daily quota %s: %w", b.id, err)
	}
	t := o.tiers[0]
	return QuotaAnswer{ID: b.id, Allowed: t.Allowed || b.shadow, WouldDeny: !t.Allowed, Limit: t.Limit,
		Remaining: max(t.Remaining, 0), ResetAfter: t.ResetAfter, Consumed: o.mask, Units: q.units}, nil
}

// Refund gives the units back when the call was denied by another limit.
func (q *QuotaCall) Refund(ctx context.Context, mask string) { q.e.refund(ctx, &q.g, mask) }
