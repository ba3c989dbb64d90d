package limiter

import (
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
)

// Algorithm names one of the counting algorithms a rule may use.
type Algorithm string

// Algorithms. The short code is what the Lua script receives and what goes into
// the state key, so changing a rule's algorithm starts from fresh state instead
// of misreading the old one.
const (
	TokenBucket   Algorithm = "token_bucket"
	GCRA          Algorithm = "gcra"
	FixedWindow   Algorithm = "fixed_window"
	SlidingWindow Algorithm = "sliding_window"
	LeakyBucket   Algorithm = "leaky_bucket"
	SlidingLog    Algorithm = "sliding_window_log"
	dayQuota      Algorithm = "day_quota" // internal: the daily quota counter
	// dayQuotaPeek is a candidate's daily quota (rule rollouts): judged on
	// the enforced day usage, never counted into it.
	dayQuotaPeek Algorithm = "day_quota_peek"
)

const algorithms = "token_bucket|gcra|fixed_window|sliding_window|leaky_bucket|sliding_window_log"

// MaxSlidingLogLimit bounds a sliding_window_log rule's limit: its state is one sorted
// set member per unit in the window. check.lua caps the effective limit at the
// same value (LOG_MAX) so an override cannot grow the set past it either.
const MaxSlidingLogLimit = 10_000

func (a Algorithm) code() string {
	switch a {
	case TokenBucket:
		return "tb"
	case GCRA:
		return "gcra"
	case FixedWindow:
		return "fw"
	case SlidingWindow:
		return "sw"
	case LeakyBucket:
		return "lb"
	case SlidingLog:
		return "swl"
	case dayQuota:
		return "day"
	case dayQuotaPeek:
		return "dayp"
	}
	return ""
}

// HasBurst reports whether the algorithm has a capacity separate from its rate.
func (a Algorithm) HasBurst() bool { return a == TokenBucket || a == GCRA || a == LeakyBucket }

// FailPolicy says how a rule answers when Redis cannot be asked in time.
type FailPolicy string

// Fail policies.
const (
	FailOpen   FailPolicy = "open"   // allow
	FailClosed FailPolicy = "closed" // deny
	FailLocal  FailPolicy = "local"  // an in-process token bucket with the rule's limit
)

const failPolicies = "open|closed|local"

// Rule is one limit of the grid, compiled from the rules file.
type Rule struct {
	ID        string
	Tier      events.Tier // ip, principal, endpoint or resource
	Kinds     []events.PrincipalKind
	Plans     []string
	Method    string // endpoint and resource tiers
	Route     string // endpoint and resource tiers
	Resource  string // resource tier: the resource type, e.g. "channel"
	Algorithm Algorithm
	Limit     int
	Period    time.Duration
	Burst     int // 0 = Limit
	// Lease, when > 0, lets each limiter instance take up to this many units
	// of a key's bucket from Redis at once and spend them in-process
	// (lease.go): fewer round trips for bounded over-admission. Token bucket
	// only; 0 = every check goes to Redis (exact).
	Lease  int
	Shadow bool
	Fail   FailPolicy
	Line   int // where the rule starts in its file
	// MaxCost caps the cost one check may charge the rule (the request's
	// cost times its route's): a check over it is refused as invalid,
	// never counted (rules file max_cost, else defaults.max_cost, else
	// events.DefaultMaxCost).
	MaxCost int
	// Defer, set by on_limit: defer, queues the route's denied or shed
	// requests for a paced replay (deferral.go); nil rejects them.
	Defer *DeferPolicy
}

// Quota is a daily quota for principals of one kind on one plan.
type Quota struct {
	Kind   events.PrincipalKind
	Plan   string
	Limit  int64
	Shadow bool
	Fail   FailPolicy
	Line   int
	// MaxCost caps the cost one check may charge the quota, like Rule.MaxCost.
	MaxCost int
}

// ID names the quota in metrics, events and overrides: "quota-<kind>-<plan>".
func (q *Quota) ID() string { return "quota-" + string(q.Kind) + "-" + q.Plan }

// Ruleset is a validated, immutable rules file. Safe for concurrent use.
type Ruleset struct {
	Source    string
	Shadow    bool    // every rule runs in shadow mode
	NearLimit float64 // share of a limit used that marks a decision near_limit
	Rules     []Rule
	Quotas    []Quota
	costs     map[string]int // "METHOD route" → cost multiplier
	period    map[string]time.Duration
	// priority is the default priority per "METHOD route" (priorities:);
	// defPriority the rest's (defaults.priority, else admission.DefaultPriority).
	priority    map[string]admission.Priority
	defPriority admission.Priority
	// Version is the rules version (floodgate.rules.v1) these rules are;
	// 0 for a file or the built-in grid. Decision events carry it.
	Version int64
	// Impact counts the version's enforced decisions (set by the rules
	// feed before the rules are put in force); nil = not counted.
	Impact Impact
	// deferral is the deferral policy per "METHOD route" (on_limit: defer).
	deferral map[string]*DeferPolicy
	// MaxCost caps a check no rule or quota matches (defaults.max_cost,
	// else events.DefaultMaxCost); minMaxCost is the smallest cap of all, so
	// a check at or below it needs no matching (CheckCost's fast path).
	MaxCost    int
	minMaxCost int64
	// maxRouteCost is the largest route cost of costs: (1 when none), so the
	// fast path needs no lookup of the request's route.
	maxRouteCost int64
}

// Priority returns the priority of a request on a route that names none.
func (rs *Ruleset) Priority(method, route string) admission.Priority {
	if len(rs.priority) > 0 { // no key built (and allocated) when the rules set none
		if p, ok := rs.priority[method+" "+route]; ok {
			return p
		}
	}
	if rs.defPriority == admission.PriorityUnset {
		return admission.DefaultPriority
	}
	return rs.defPriority
}

// DefaultPlan is the plan of a principal nobody assigned one.
const DefaultPlan = "default"

// Cost returns the cost multiplier of a route (1 unless the file says otherwise).
func (rs *Ruleset) Cost(method, route string) int {
	if c, ok := rs.costs[method+" "+route]; ok {
		return c
	}
	return 1
}

// Rule returns the rule with id, or nil.
func (rs *Ruleset) Rule(id string) *Rule {
	for i := range rs.Rules {
		if rs.Rules[i].ID == id {
			return &rs.Rules[i]
		}
	}
	return nil
}

// Quota returns the daily quota of kind on plan, falling back to the default plan.
func (rs *Ruleset) Quota(kind events.PrincipalKind, plan string) *Quota {
	var def *Quota
	for i := range rs.Quotas {
		q := &rs.Quotas[i]
		if q.Kind != kind {
			continue
		}
		if q.Plan == plan {
			return q
		}
		if q.Plan == DefaultPlan {
			def = q
		}
	}
	return def
}

// Matches reports whether r applies to a request.
func (r *Rule) Matches(kind events.PrincipalKind, plan, method, route, resourceType string) bool {
	if len(r.Kinds) > 0 && !slices.Contains(r.Kinds, kind) {
		return false
	}
	if len(r.Plans) > 0 && !slices.Contains(r.Plans, plan) {
		return false
	}
	switch r.Tier {
	case events.TierEndpoint:
		return r.Method == method && r.Route == route
	case events.TierResource:
		return r.Method == method && r.Route == route && r.Resource == resourceType
	}
	return true
}

func (rs *Ruleset) setMinMaxCost() {
	m := rs.MaxCost
	for _, r := range rs.Rules {
		m = min(m, r.MaxCost)
	}
	for _, q := range rs.Quotas {
		m = min(m, q.MaxCost)
	}
	rs.minMaxCost = int64(m)
	rs.maxRouteCost = 1
	for _, c := range rs.costs {
		rs.maxRouteCost = max(rs.maxRouteCost, int64(c))
	}
}

// CostError refuses a check whose cost is over the max_cost of a rule or
// quota it matches (issue 22 S3): the check is invalid, nothing is counted.
type CostError struct {
	Cost      int64  // what the check would charge: the request's cost × the route's
	Requested int    // the request's cost
	Max       int    // the cap it is over
	Scope     string // the rule or quota id, or "defaults" when nothing matched
}

func (e *CostError) Error() string {
	what := "rule " + e.Scope
	switch {
	case e.Scope == "defaults":
		what = "the rules (defaults.max_cost: no rule or quota matches)"
	case strings.HasPrefix(e.Scope, "quota-"):
		what = "quota " + e.Scope
	}
	if e.Cost != int64(e.Requested) {
		return fmt.Sprintf("cost %d (%d × the route's cost %d) is over the max_cost %d of %s", e.Cost, e.Requested, e.Cost/int64(max(e.Requested, 1)), e.Max, what)
	}
	return fmt.Sprintf("cost %d is over the max_cost %d of %s", e.Cost, e.Max, what)
}

// checkCost returns a *CostError when cost is over the cap of a rule or
// quota a check of kind on plan for method, route and resource type
// matches (ip-tier rules only when the check has an IP), or — when none
// matches — over MaxCost.
func (rs *Ruleset) checkCost(kind events.PrincipalKind, plan, method, route, resType string, hasIP bool, cost int64, requested int, overrideQuota bool) error {
	if cost <= rs.minMaxCost {
		return nil
	}
	matched := false
	for i := range rs.Rules {
		r := &rs.Rules[i]
		if (r.Tier == events.TierIP && !hasIP) || !r.Matches(kind, plan, method, route, resType) {
			continue
		}
		matched = true
		if c := capOf(r.MaxCost); cost > int64(c) {
			return &CostError{Cost: cost, Requested: requested, Max: c, Scope: r.ID}
		}
	}
	def := capOf(rs.MaxCost)
	if q := rs.Quota(kind, plan); q != nil {
		matched = true
		if c := capOf(q.MaxCost); cost > int64(c) {
			return &CostError{Cost: cost, Requested: requested, Max: c, Scope: q.ID()}
		}
	} else if overrideQuota && cost > int64(def) { // a quota only an override sets: the file's default cap
		return &CostError{Cost: cost, Requested: requested, Max: def, Scope: "quota-" + string(kind) + "-" + plan}
	}
	if !matched && cost > int64(def) {
		return &CostError{Cost: cost, Requested: requested, Max: def, Scope: "defaults"}
	}
	return nil
}

// capOf is a max_cost, events.DefaultMaxCost when unset (a Ruleset built
// in code rather than parsed).
func capOf(v int) int {
	if v <= 0 {
		return events.DefaultMaxCost
	}
	return v
}

func validFail(f FailPolicy) bool { return f == FailOpen || f == FailClosed || f == FailLocal }

// SinglePrincipalRules is the grid FLOODGATE_LIMITER_PRINCIPAL_LIMIT asks for when
// no rules file is configured: one token bucket per principal, every kind.
func SinglePrincipalRules(limit int, period time.Duration) *Ruleset {
	rs := &Ruleset{
		Source: "FLOODGATE_LIMITER_PRINCIPAL_LIMIT", NearLimit: 0.8, costs: map[string]int{},
		period: map[string]time.Duration{"principal": period}, MaxCost: events.DefaultMaxCost,
		Rules: []Rule{{ID: "principal", Tier: events.TierPrincipal, Algorithm: TokenBucket, Limit: limit,
			Period: period, Fail: FailOpen, MaxCost: events.DefaultMaxCost}},
	}
	rs.setMinMaxCost()
	return rs
}
