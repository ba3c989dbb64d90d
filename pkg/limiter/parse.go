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
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
)

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
	resTypeRegexp = regexp.MustCompile(`^[a-z][a-z0-9_]*$`)
)

// ParseRules parses and validates a rules file. name prefixes every error
// ("rate-limits.yaml:12: rules[3].limit: must be at least 1"); all problems are
// reported together. It reads in steps: the document, its header and
// defaults, the route costs and priorities, the rules, the quotas, and last
// whether every route cost fits the caps of what counts it.
func ParseRules(name string, data []byte) (*Ruleset, error) {
	p := &parser{name: name}
	top, doc, err := p.decode(data)
	if err != nil {
		return nil, err
	}
	rs := &Ruleset{Source: name, Shadow: doc.Shadow, NearLimit: 0.8, costs: map[string]int{}, period: map[string]time.Duration{}, priority: map[string]admission.Priority{}}
	defAlg, defFail := p.header(rs, top, &doc)
	costLines := p.costs(rs, top, doc.Costs)
	p.priorities(rs, top, &doc)
	seen := p.rules(rs, top, doc.Rules, defAlg, defFail)
	p.quotas(rs, top, doc.Quotas, defFail, seen)
	if len(rs.Rules) == 0 && len(rs.Quotas) == 0 {
		p.fail(top.Line, "rules", "at least one rule or quota is required")
	}
	p.costsFit(rs, doc.Costs, costLines)
	if err := p.err(); err != nil {
		return nil, err
	}
	rs.setMinMaxCost()
	return rs, nil
}

// decode reads the YAML document, refusing unknown keys anywhere with their
// line (not silently ignored typos), and returns its top mapping.
func (p *parser) decode(data []byte) (*yaml.Node, fileDoc, error) {
	var root yaml.Node
	var doc fileDoc
	dec := yaml.NewDecoder(bytes.NewReader(data))
	if err := dec.Decode(&root); err != nil {
		return nil, doc, fixYAMLError(err, p.name)
	}
	if len(root.Content) != 1 || root.Content[0].Kind != yaml.MappingNode {
		return nil, doc, fmt.Errorf("%s:%d: the rules file must be a mapping", p.name, root.Line)
	}
	p.checkKeys(root.Content[0], "", fileSchemaKeys)
	if err := root.Content[0].Decode(&doc); err != nil {
		return nil, doc, fixYAMLError(err, p.name)
	}
	if err := p.err(); err != nil {
		return nil, doc, err
	}
	return root.Content[0], doc, nil
}

// header reads the version, the near-limit ratio and the defaults; it
// returns the default algorithm and fail policy of rules that name none.
func (p *parser) header(rs *Ruleset, top *yaml.Node, doc *fileDoc) (Algorithm, FailPolicy) {
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
	return defAlg, defFail
}

// costs reads the route costs; it returns each one's line, for costsFit.
func (p *parser) costs(rs *Ruleset, top *yaml.Node, fcs []fileCost) []int {
	costs := child(top, "costs")
	costLines := make([]int, len(fcs))
	for i, c := range fcs {
		n := item(costs, i)
		path := fmt.Sprintf("costs[%d]", i)
		p.methodRoute(n, path, c.Method, c.Route)
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
	return costLines
}

// methodRoute checks the method and route of the item n at path (a cost's,
// a priority's).
func (p *parser) methodRoute(n *yaml.Node, path, method, route string) {
	if err := events.ValidMethod(method); err != nil {
		p.fail(p.line(n, "method"), path+".method", "%v", err)
	}
	if err := events.ValidRoute(route); err != nil {
		p.fail(p.line(n, "route"), path+".route", "%v", err)
	}
}

// priorities reads the default priority and each route's.
func (p *parser) priorities(rs *Ruleset, top *yaml.Node, doc *fileDoc) {
	if doc.Defaults.Priority != "" {
		pr, err := admission.ParsePriority(doc.Defaults.Priority)
		if err != nil {
			p.fail(p.line(child(top, "defaults"), "priority"), "defaults.priority", "%v", err)
		}
		rs.defPriority = pr
	}
	prios := child(top, "priorities")
	for i, fp := range doc.Priorities {
		n := item(prios, i)
		path := fmt.Sprintf("priorities[%d]", i)
		p.methodRoute(n, path, fp.Method, fp.Route)
		pr, err := admission.ParsePriority(fp.Priority)
		if err != nil || pr == admission.PriorityUnset {
			p.fail(p.line(n, "priority"), path+".priority", "%q: want one of %s", fp.Priority, admission.PriorityNames)
		}
		k := fp.Method + " " + fp.Route
		if _, dup := rs.priority[k]; dup {
			p.fail(n.Line, path, "a priority for %s is already set", k)
		}
		rs.priority[k] = pr
	}
}

// rules reads every rule; it returns the line of each rule id, for the
// quotas' ids.
func (p *parser) rules(rs *Ruleset, top *yaml.Node, frs []fileRule, defAlg Algorithm, defFail FailPolicy) map[string]int {
	rules := child(top, "rules")
	seen := map[string]int{}
	for i, fr := range frs {
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
		p.ruleScope(n, path, fr, &r)
		p.ruleLimit(n, path, fr, &r)
		r.MaxCost = p.maxCost(n, path+".max_cost", fr.MaxCost, rs.MaxCost)
		p.deferral(rs, n, path, fr, &r)
		rs.Rules = append(rs.Rules, r)
		rs.period[r.ID] = r.Period
	}
	return seen
}

// ruleScope reads what a rule counts: its tier and the route, resource,
// kinds and plans it applies to.
func (p *parser) ruleScope(n *yaml.Node, path string, fr fileRule, r *Rule) {
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
		if !events.ValidPlan(pl) {
			p.fail(p.line(n, "plans"), fmt.Sprintf("%s.plans[%d]", path, j), "%q: want [a-z0-9][a-z0-9_-]{0,31}", pl)
		}
	}
}

// ruleLimit reads how a rule counts: its algorithm, limit, period, burst,
// lease and fail policy.
func (p *parser) ruleLimit(n *yaml.Node, path string, fr fileRule, r *Rule) {
	if fr.Algorithm != "" {
		r.Algorithm = Algorithm(fr.Algorithm)
		if r.Algorithm.code() == "" || r.Algorithm == dayQuota {
			p.fail(p.line(n, "algorithm"), path+".algorithm", "%q: want one of %s", fr.Algorithm, algorithms)
		}
	}
	if fr.Limit < 1 || fr.Limit > 1_000_000_000 {
		p.fail(p.line(n, "limit"), path+".limit", "%d: must be in 1..1000000000", fr.Limit)
	} else if r.Algorithm == SlidingLog && fr.Limit > MaxSlidingLogLimit {
		p.fail(p.line(n, "limit"), path+".limit", "%d: sliding_window_log keeps one entry per unit; must be at most %d (use sliding_window)", fr.Limit, MaxSlidingLogLimit)
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
		if !r.Algorithm.HasBurst() {
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
}

// quotas reads the daily quotas; a quota's id may not be a rule's (seen).
func (p *parser) quotas(rs *Ruleset, top *yaml.Node, fqs []fileQuo, defFail FailPolicy, seen map[string]int) {
	quotas := child(top, "quotas")
	seenQ := map[string]int{}
	for i, fq := range fqs {
		n := item(quotas, i)
		path := fmt.Sprintf("quotas[%d]", i)
		q := Quota{Kind: events.PrincipalKind(fq.Kind), Plan: fq.Plan, Limit: fq.Limit, Shadow: fq.Shadow, Fail: defFail, Line: n.Line}
		if q.Plan == "" {
			q.Plan = DefaultPlan
		}
		if !q.Kind.Valid() {
			p.fail(p.line(n, "kind"), path+".kind", "%q: want one of user|bot|api_key|anonymous", fq.Kind)
		}
		if !events.ValidPlan(q.Plan) {
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
}

// costsFit refuses a route's cost over the max_cost of a rule or quota
// that counts it: it would refuse every request on the route, so say so
// now, not per request.
func (p *parser) costsFit(rs *Ruleset, fcs []fileCost, costLines []int) {
	for i, c := range fcs {
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
