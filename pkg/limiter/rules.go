package limiter

import (
	"bytes"
	"errors"
	"fmt"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/pkg/events"
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

// maxLogLimit bounds a sliding_window_log rule's limit: its state is one sorted
// set member per unit in the window. check.lua caps the effective limit at the
// same value (LOG_MAX) so an override cannot grow the set past it either.
const maxLogLimit = 10_000

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

// hasBurst reports whether the algorithm has a capacity separate from its rate.
func (a Algorithm) hasBurst() bool { return a == TokenBucket || a == GCRA || a == LeakyBucket }

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
	// defPriority the rest's (defaults.priority, else DefaultPriority).
	priority    map[string]Priority
	defPriority Priority
	// Version is the rules version (floodgate.rules.v1) these rules are;
	// 0 for a file or the built-in grid. Decision events carry it.
	Version int64
	impact  *impactCounts // the version's enforced counts; nil = not counted
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
func (rs *Ruleset) Priority(method, route string) Priority {
	if len(rs.priority) > 0 { // no key built (and allocated) when the rules set none
		if p, ok := rs.priority[method+" "+route]; ok {
			return p
		}
	}
	if rs.defPriority == PriorityUnset {
		return DefaultPriority
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

// Rules file schema (version 1). Field names match schemas/rate-limits.schema.json.
type fileDoc struct {
	Version    int        `yaml:"version"`
	Shadow     bool       `yaml:"shadow"`
	NearLimit  *float64   `yaml:"near_limit_ratio"`
	Defaults   fileDefs   `yaml:"defaults"`
	Costs      []fileCost `yaml:"costs"`
	Priorities []filePrio `yaml:"priorities"`
	Rules      []fileRule `yaml:"rules"`
	Quotas     []fileQuo  `yaml:"quotas"`
}

type fileDefs struct {
	Algorithm string `yaml:"algorithm"`
	Fail      string `yaml:"fail"`
	Priority  string `yaml:"priority"`
	MaxCost   *int   `yaml:"max_cost"`
}

type filePrio struct {
	Method   string `yaml:"method"`
	Route    string `yaml:"route"`
	Priority string `yaml:"priority"`
}

type fileCost struct {
	Method string `yaml:"method"`
	Route  string `yaml:"route"`
	Cost   int    `yaml:"cost"`
}

type fileRule struct {
	ID        string   `yaml:"id"`
	Tier      string   `yaml:"tier"`
	Kinds     []string `yaml:"kinds"`
	Plans     []string `yaml:"plans"`
	Method    string   `yaml:"method"`
	Route     string   `yaml:"route"`
	Resource  string   `yaml:"resource"`
	Algorithm string   `yaml:"algorithm"`
	Limit     int      `yaml:"limit"`
	Period    string   `yaml:"period"`
	Burst     int      `yaml:"burst"`
	Lease     int      `yaml:"lease"`
	Shadow    bool     `yaml:"shadow"`
	Fail      string   `yaml:"fail"`
	MaxCost   *int     `yaml:"max_cost"`

	// on_limit: defer and its policy (deferral.go)
	OnLimit string     `yaml:"on_limit"`
	Defer   *fileDefer `yaml:"defer"`
}

type fileQuo struct {
	Kind    string `yaml:"kind"`
	Plan    string `yaml:"plan"`
	Limit   int64  `yaml:"limit"`
	Shadow  bool   `yaml:"shadow"`
	Fail    string `yaml:"fail"`
	MaxCost *int   `yaml:"max_cost"`
}

var (
	ruleIDPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,63}$`)
	planPattern   = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)
	resTypeRegexp = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// ParseRules parses and validates a rules file. name prefixes every error
// ("rate-limits.yaml:12: rules[3].limit: must be at least 1"); all problems are
// reported together.
func ParseRules(name string, data []byte) (*Ruleset, error) {
	var root yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		return nil, fixYAMLError(err, name)
	}
	p := &parser{name: name}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, fmt.Errorf("%s:%d: the rules file must be a mapping", name, root.Line)
	}
	// Unknown keys anywhere are errors with their line, not silently ignored typos.
	p.checkKeys(root.Content[0], "", fileSchemaKeys)
	var doc fileDoc
	if err := root.Content[0].Decode(&doc); err != nil {
		return nil, fixYAMLError(err, name)
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	top := root.Content[0]
	rs := &Ruleset{Source: name, Shadow: doc.Shadow, NearLimit: 0.8, costs: map[string]int{}, period: map[string]time.Duration{}, priority: map[string]Priority{}}
	if doc.Version != 1 {
		p.fail(p.line(top, "version"), "version", "must be 1, got %d", doc.Version)
	}
	if doc.NearLimit != nil {
		rs.NearLimit = *doc.NearLimit
		if rs.NearLimit <= 0 || rs.NearLimit > 1 {
			p.fail(p.line(top, "near_limit_ratio"), "near_limit_ratio", "%g: must be in (0, 1]", rs.NearLimit)
		}
	}
	defAlg, defFail := TokenBucket, FailOpen
	defs := child(top, "defaults")
	if doc.Defaults.Algorithm != "" {
		defAlg = Algorithm(doc.Defaults.Algorithm)
		if defAlg.code() == "" || defAlg == dayQuota {
			p.fail(p.line(defs, "algorithm"), "defaults.algorithm", "%q: want one of %s", doc.Defaults.Algorithm, algorithms)
		}
	}
	if doc.Defaults.Fail != "" {
		defFail = FailPolicy(doc.Defaults.Fail)
		if !validFail(defFail) {
			p.fail(p.line(defs, "fail"), "defaults.fail", "%q: want one of %s", doc.Defaults.Fail, failPolicies)
		}
	}
	rs.MaxCost = p.maxCost(defs, "defaults.max_cost", doc.Defaults.MaxCost, events.DefaultMaxCost)

	costs := child(top, "costs")
	costLines := make([]int, len(doc.Costs))
	for i, c := range doc.Costs {
		n := item(costs, i)
		path := fmt.Sprintf("costs[%d]", i)
		if err := events.ValidMethod(c.Method); err != nil {
			p.fail(p.line(n, "method"), path+".method", "%v", err)
		}
		if err := events.ValidRoute(c.Route); err != nil {
			p.fail(p.line(n, "route"), path+".route", "%v", err)
		}
		costLines[i] = p.line(n, "cost")
		if c.Cost < 1 || c.Cost > 1_000_000 {
			p.fail(costLines[i], path+".cost", "%d: must be in 1..1000000", c.Cost)
		}
		k := c.Method + " " + c.Route
		if _, dup := rs.costs[k]; dup {
			p.fail(n.Line, path, "a cost for %s is already set", k)
		}
		rs.costs[k] = c.Cost
	}
	if doc.Defaults.Priority != "" {
		pr, err := ParsePriority(doc.Defaults.Priority)
		if err != nil {
			p.fail(p.line(defs, "priority"), "defaults.priority", "%v", err)
		}
		rs.defPriority = pr
	}
	prios := child(top, "priorities")
	for i, fp := range doc.Priorities {
		n := item(prios, i)
		path := fmt.Sprintf("priorities[%d]", i)
		if err := events.ValidMethod(fp.Method); err != nil {
			p.fail(p.line(n, "method"), path+".method", "%v", err)
		}
		if err := events.ValidRoute(fp.Route); err != nil {
			p.fail(p.line(n, "route"), path+".route", "%v", err)
		}
		pr, err := ParsePriority(fp.Priority)
		if err != nil || pr == PriorityUnset {
			p.fail(p.line(n, "priority"), path+".priority", "%q: want one of %s", fp.Priority, PriorityNames)
		}
		k := fp.Method + " " + fp.Route
		if _, dup := rs.priority[k]; dup {
			p.fail(n.Line, path, "a priority for %s is already set", k)
		}
		rs.priority[k] = pr
	}

	rules := child(top, "rules")
	seen := map[string]int{}
	for i, fr := range doc.Rules {
		n := item(rules, i)
		path := fmt.Sprintf("rules[%d]", i)
		r := Rule{ID: fr.ID, Tier: events.Tier(fr.Tier), Plans: fr.Plans, Method: fr.Method, Route: fr.Route,
			Resource: fr.Resource, Algorithm: defAlg, Limit: fr.Limit, Burst: fr.Burst, Shadow: fr.Shadow, Fail: defFail, Line: n.Line}
		if !ruleIDPattern.MatchString(fr.ID) {
			p.fail(p.line(n, "id"), path+".id", "%q: want [a-z0-9][a-z0-9_-]{0,63}", fr.ID)
		} else if prev, dup := seen[fr.ID]; dup {
			p.fail(p.line(n, "id"), path+".id", "%q is already the id of the rule at line %d", fr.ID, prev)
		} else {
			seen[fr.ID] = n.Line
			path = fmt.Sprintf("rules[%d] (%s)", i, fr.ID)
		}
		switch r.Tier {
		case events.TierIP, events.TierPrincipal:
			if fr.Method != "" || fr.Route != "" || fr.Resource != "" {
				p.fail(n.Line, path, "tier %s applies to every route: remove method, route and resource", r.Tier)
			}
		case events.TierEndpoint, events.TierResource:
			if err := events.ValidMethod(fr.Method); err != nil {
				p.fail(p.line(n, "method"), path+".method", "%v", err)
			}
			if err := events.ValidRoute(fr.Route); err != nil {
				p.fail(p.line(n, "route"), path+".route", "%v", err)
			}
			if r.Tier == events.TierResource && !resTypeRegexp.MatchString(fr.Resource) {
				p.fail(p.line(n, "resource"), path+".resource", "%q: a resource type such as channel, [a-z][a-z0-9_]*", fr.Resource)
			}
			if r.Tier == events.TierEndpoint && fr.Resource != "" {
				p.fail(p.line(n, "resource"), path+".resource", "only resource-tier rules name a resource type")
			}
		default:
			p.fail(p.line(n, "tier"), path+".tier", "%q: want one of ip|principal|endpoint|resource", fr.Tier)
		}
		for j, k := range fr.Kinds {
			if !events.PrincipalKind(k).Valid() {
				p.fail(p.line(n, "kinds"), fmt.Sprintf("%s.kinds[%d]", path, j), "%q: want one of user|bot|api_key|anonymous", k)
			}
			r.Kinds = append(r.Kinds, events.PrincipalKind(k))
		}
		for j, pl := range fr.Plans {
			if !planPattern.MatchString(pl) {
				p.fail(p.line(n, "plans"), fmt.Sprintf("%s.plans[%d]", path, j), "%q: want [a-z0-9][a-z0-9_-]{0,31}", pl)
			}
		}
		if fr.Algorithm != "" {
			r.Algorithm = Algorithm(fr.Algorithm)
			if r.Algorithm.code() == "" || r.Algorithm == dayQuota {
				p.fail(p.line(n, "algorithm"), path+".algorithm", "%q: want one of %s", fr.Algorithm, algorithms)
			}
		}
		if fr.Limit < 1 || fr.Limit > 1_000_000_000 {
			p.fail(p.line(n, "limit"), path+".limit", "%d: must be in 1..1000000000", fr.Limit)
		} else if r.Algorithm == SlidingLog && fr.Limit > maxLogLimit {
			p.fail(p.line(n, "limit"), path+".limit", "%d: sliding_window_log keeps one entry per unit; must be at most %d (use sliding_window)", fr.Limit, maxLogLimit)
		}
		d, err := time.ParseDuration(fr.Period)
		switch {
		case fr.Period == "":
			p.fail(n.Line, path+".period", "required, a duration such as 5s, 1m or 24h")
		case err != nil:
			p.fail(p.line(n, "period"), path+".period", "%q: want a duration such as 5s, 1m or 24h", fr.Period)
		case d < time.Millisecond || d > 7*24*time.Hour:
			p.fail(p.line(n, "period"), path+".period", "%s: must be in 1ms..168h", d)
		case d%time.Millisecond != 0:
			p.fail(p.line(n, "period"), path+".period", "%s: must be whole milliseconds", d)
		}
		r.Period = d
		if fr.Burst != 0 {
			if !r.Algorithm.hasBurst() {
				p.fail(p.line(n, "burst"), path+".burst", "%s has no burst; only token_bucket, gcra and leaky_bucket do", r.Algorithm)
			} else if fr.Burst < fr.Limit && fr.Burst >= 0 || fr.Burst < 0 {
				p.fail(p.line(n, "burst"), path+".burst", "%d: must be at least the limit %d", fr.Burst, fr.Limit)
			}
		}
		if fr.Lease != 0 {
			capacity := max(fr.Limit, fr.Burst)
			switch {
			case r.Algorithm != TokenBucket:
				p.fail(p.line(n, "lease"), path+".lease", "%s cannot lease; only token_bucket can", r.Algorithm)
			case fr.Shadow:
				p.fail(p.line(n, "lease"), path+".lease", "a shadow rule cannot lease: it is judged exactly or not at all")
			case fr.Lease < 1 || fr.Lease > capacity:
				p.fail(p.line(n, "lease"), path+".lease", "%d: must be in 1..%d (the bucket's capacity)", fr.Lease, capacity)
			}
			r.Lease = fr.Lease
		}
		if fr.Fail != "" {
			r.Fail = FailPolicy(fr.Fail)
			if !validFail(r.Fail) {
				p.fail(p.line(n, "fail"), path+".fail", "%q: want one of %s", fr.Fail, failPolicies)
			}
		}
		r.MaxCost = p.maxCost(n, path+".max_cost", fr.MaxCost, rs.MaxCost)
		p.deferral(rs, n, path, fr, &r)
		rs.Rules = append(rs.Rules, r)
		rs.period[r.ID] = r.Period
	}

	quotas := child(top, "quotas")
	seenQ := map[string]int{}
	for i, fq := range doc.Quotas {
		n := item(quotas, i)
		path := fmt.Sprintf("quotas[%d]", i)
		q := Quota{Kind: events.PrincipalKind(fq.Kind), Plan: fq.Plan, Limit: fq.Limit, Shadow: fq.Shadow, Fail: defFail, Line: n.Line}
		if q.Plan == "" {
			q.Plan = DefaultPlan
		}
		if !q.Kind.Valid() {
			p.fail(p.line(n, "kind"), path+".kind", "%q: want one of user|bot|api_key|anonymous", fq.Kind)
		}
		if !planPattern.MatchString(q.Plan) {
			p.fail(p.line(n, "plan"), path+".plan", "%q: want [a-z0-9][a-z0-9_-]{0,31}", q.Plan)
		}
		if q.Limit < 1 || q.Limit > events.MaxSafeInteger {
			p.fail(p.line(n, "limit"), path+".limit", "%d: must be at least 1", q.Limit)
		}
		if fq.Fail != "" {
			q.Fail = FailPolicy(fq.Fail)
			if !validFail(q.Fail) {
				p.fail(p.line(n, "fail"), path+".fail", "%q: want one of %s", fq.Fail, failPolicies)
			}
		}
		q.MaxCost = p.maxCost(n, path+".max_cost", fq.MaxCost, rs.MaxCost)
		if prev, dup := seenQ[q.ID()]; dup {
			p.fail(n.Line, path, "kind %s plan %s already has the quota at line %d", q.Kind, q.Plan, prev)
		}
		seenQ[q.ID()] = n.Line
		if _, clash := seen[q.ID()]; clash {
			p.fail(n.Line, path, "%s is also a rule id", q.ID())
		}
		rs.Quotas = append(rs.Quotas, q)
	}
	if len(rs.Rules) == 0 && len(rs.Quotas) == 0 {
		p.fail(top.Line, "rules", "at least one rule or quota is required")
	}
	// A route's cost over the max_cost of a rule or quota that counts it
	// would refuse every request on the route: say so now, not per request.
	for i, c := range doc.Costs {
		for _, r := range rs.Rules {
			if (r.Tier == events.TierIP || r.Tier == events.TierPrincipal || (r.Method == c.Method && r.Route == c.Route)) && c.Cost > r.MaxCost {
				p.fail(costLines[i], fmt.Sprintf("costs[%d].cost", i), "%d is over max_cost %d of rule %s (line %d): every request on %s %s would be refused; raise the rule's max_cost or defaults.max_cost",
					c.Cost, r.MaxCost, r.ID, r.Line, c.Method, c.Route)
			}
		}
		for _, q := range rs.Quotas {
			if c.Cost > q.MaxCost {
				p.fail(costLines[i], fmt.Sprintf("costs[%d].cost", i), "%d is over max_cost %d of quota %s (line %d): every request on %s %s would be refused; raise the quota's max_cost or defaults.max_cost",
					c.Cost, q.MaxCost, q.ID(), q.Line, c.Method, c.Route)
			}
		}
	}
	if err := p.err(); err != nil {
		return nil, err
	}
	rs.setMinMaxCost()
	return rs, nil
}

// maxCost reads a max_cost field of mapping n: v when set (1..1,000,000),
// else def.
func (p *parser) maxCost(n *yaml.Node, path string, v *int, def int) int {
	if v == nil {
		return def
	}
	if *v < 1 || *v > 1_000_000 {
		p.fail(p.line(n, "max_cost"), path, "%d: must be in 1..1000000", *v)
		return def
	}
	return *v
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

// fileSchemaKeys lists the keys allowed at each path ("" is the top level,
// "rules[]" any rule), mirroring the JSON Schema's additionalProperties: false.
var fileSchemaKeys = map[string][]string{
	"":             {"version", "shadow", "near_limit_ratio", "defaults", "costs", "priorities", "rules", "quotas"},
	"defaults":     {"algorithm", "fail", "priority", "max_cost"},
	"costs[]":      {"method", "route", "cost"},
	"priorities[]": {"method", "route", "priority"},
	"rules[]":      {"id", "tier", "kinds", "plans", "method", "route", "resource", "algorithm", "limit", "period", "burst", "lease", "shadow", "fail", "max_cost", "on_limit", "defer"},
	"quotas[]":     {"kind", "plan", "limit", "shadow", "fail", "max_cost"},

	// deferral.go
	"rules[].defer":            deferKeys,
	"rules[].defer.max_queued": {"principal", "route"},
}

type parser struct {
	name string
	errs []error
}

func (p *parser) fail(line int, path, format string, args ...any) {
	p.errs = append(p.errs, fmt.Errorf("%s:%d: %s: %s", p.name, line, path, fmt.Sprintf(format, args...)))
}

func (p *parser) err() error { return errors.Join(p.errs...) }

func (p *parser) checkKeys(n *yaml.Node, path string, allowed map[string][]string) {
	keys, ok := allowed[path]
	if !ok || n.Kind != yaml.MappingNode {
		return
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		k, v := n.Content[i], n.Content[i+1]
		if !slices.Contains(keys, k.Value) {
			where := path
			if where == "" {
				where = "top level"
			}
			p.fail(k.Line, strings.TrimSuffix(where, "[]"), "unknown key %q; allowed: %s", k.Value, strings.Join(keys, ", "))
			continue
		}
		sub := k.Value
		if path != "" {
			sub = path + "." + k.Value
		}
		if v.Kind == yaml.SequenceNode {
			for _, it := range v.Content {
				p.checkKeys(it, sub+"[]", allowed)
			}
		} else {
			p.checkKeys(v, sub, allowed)
		}
	}
}

// line returns the line of key's value in mapping n, or n's line.
func (p *parser) line(n *yaml.Node, key string) int {
	if c := child(n, key); c != nil {
		return c.Line
	}
	if n == nil {
		return 0
	}
	return n.Line
}

func child(n *yaml.Node, key string) *yaml.Node {
	if n == nil || n.Kind != yaml.MappingNode {
		return nil
	}
	for i := 0; i+1 < len(n.Content); i += 2 {
		if n.Content[i].Value == key {
			return n.Content[i+1]
		}
	}
	return nil
}

func item(seq *yaml.Node, i int) *yaml.Node {
	if seq == nil || seq.Kind != yaml.SequenceNode || i >= len(seq.Content) {
		return &yaml.Node{}
	}
	return seq.Content[i]
}

var yamlLine = regexp.MustCompile(`^(?:yaml: )?line (\d+): `)

// fixYAMLError turns yaml.v3's "yaml: line 7: cannot unmarshal ..." into "name:7: ...".
func fixYAMLError(err error, name string) error {
	msgs := []string{err.Error()}
	var te *yaml.TypeError
	if errors.As(err, &te) {
		msgs = te.Errors
	}
	out := make([]error, 0, len(msgs))
	for _, msg := range msgs {
		if m := yamlLine.FindStringSubmatch(msg); m != nil {
			out = append(out, fmt.Errorf("%s:%s: %s", name, m[1], msg[len(m[0]):]))
			continue
		}
		out = append(out, fmt.Errorf("%s: %s", name, msg))
	}
	return errors.Join(out...)
}

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
