package rollout

import (
	"fmt"
	"math"
	"slices"
	"strconv"
	"strings"
)

// Class dimensions a candidate is judged on: every decision belongs to one
// class of each (its priority, its principal's kind, its route, its plan).
const (
	DimPriority = "priority"
	DimKind     = "kind"
	DimRoute    = "route"
	DimPlan     = "plan"
)

// Dims lists the dimensions in the order pages show them.
var Dims = []string{DimPriority, DimKind, DimRoute, DimPlan}

// Class is one class of traffic: a dimension and its value, e.g. kind=user.
type Class struct{ Dim, Value string }

func (c Class) String() string { return c.Dim + "=" + c.Value }

// Paired counts one class's decisions that both the candidate and its parent
// judged — the same traffic: N decisions, of which the candidate blocked (or
// would have blocked) Cand and the parent blocked Parent.
type Paired struct{ N, Cand, Parent int64 }

// Add returns the sum of two counts.
func (p Paired) Add(q Paired) Paired { return Paired{p.N + q.N, p.Cand + q.Cand, p.Parent + q.Parent} }

// Diff is the candidate's block share minus the parent's (0 with no decision).
func (p Paired) Diff() float64 {
	if p.N == 0 {
		return 0
	}
	return float64(p.Cand-p.Parent) / float64(p.N)
}

// Interval is the two-sided interval of the difference at z standard
// errors: Newcombe's hybrid score interval, from the Wilson score intervals
// of the two shares. It treats the shares as independent, which on paired
// decisions (the same requests, mostly judged alike) only widens it: the
// bounds are conservative, and they stay honest at shares of 0 and 1 and at
// small counts, where a normal approximation claims certainty it has not.
func (p Paired) Interval(z float64) (lo, hi float64) {
	if p.N == 0 {
		return -1, 1
	}
	p1, p2 := float64(p.Cand)/float64(p.N), float64(p.Parent)/float64(p.N)
	l1, u1 := wilson(p.Cand, p.N, z)
	l2, u2 := wilson(p.Parent, p.N, z)
	d := p1 - p2
	return d - math.Sqrt((p1-l1)*(p1-l1)+(u2-p2)*(u2-p2)), d + math.Sqrt((u1-p1)*(u1-p1)+(p2-l2)*(p2-l2))
}

// wilson is the Wilson score interval of k successes in n at z.
func wilson(k, n int64, z float64) (lo, hi float64) {
	nf, p := float64(n), float64(k)/float64(n)
	den := 1 + z*z/nf
	mid := (p + z*z/(2*nf)) / den
	half := z / den * math.Sqrt(p*(1-p)/nf+z*z/(4*nf*nf))
	return max(0, mid-half), min(1, mid+half)
}

// Confidence is how sure the counts make it that the candidate raises the
// class's block share by at most limit over its parent's: the one-sided
// level 1 − α at which the interval's upper bound just reaches the limit
// (0.5 when the difference sits on the limit, below 0.5 above it).
func (p Paired) Confidence(limit float64) float64 {
	if p.N == 0 {
		return 0
	}
	d := p.Diff()
	// hi(z) grows with z and lo(z) falls: find where the bound meets the limit.
	bound := func(z float64) float64 {
		lo, hi := p.Interval(z)
		if d <= limit {
			return hi
		}
		return -lo
	}
	target := limit
	if d > limit {
		target = -limit
	}
	a, b := 0.0, 8.0
	if bound(b) <= target {
		a = b
	} else {
		for range 50 {
			m := (a + b) / 2
			if bound(m) <= target {
				a = m
			} else {
				b = m
			}
		}
	}
	phi := 0.5 * (1 + math.Erf(a/math.Sqrt2))
	if d > limit {
		return 1 - phi
	}
	return phi
}

// ClassLimits are the most each class's block share may rise over the
// parent's on the same traffic (0.01: one percentage point), by class
// ("kind=user"), else by dimension ("kind"), else Default.
type ClassLimits struct {
	Default float64
	By      map[string]float64
}

// DefaultClassLimits: CRITICAL may rise half a point, DEGRADED two, any
// other class five.
func DefaultClassLimits() ClassLimits {
	return ClassLimits{Default: 0.05, By: map[string]float64{"priority=critical": 0.005, "priority=degraded": 0.02}}
}

// Of returns the limit of class c.
func (l ClassLimits) Of(c Class) float64 {
	if v, ok := l.By[c.String()]; ok {
		return v
	}
	if v, ok := l.By[c.Dim]; ok {
		return v
	}
	return l.Default
}

// ParseClassLimits reads "default=0.05,priority=critical:0.005,kind:0.02"
// (class or dimension, a colon, the limit as a fraction in [0, 1]); what is
// not given keeps DefaultClassLimits.
func ParseClassLimits(s string) (ClassLimits, error) {
	l := DefaultClassLimits()
	for _, item := range strings.Split(s, ",") {
		if item = strings.TrimSpace(item); item == "" {
			continue
		}
		if v, ok := strings.CutPrefix(item, "default="); ok {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil || f < 0 || f > 1 {
				return ClassLimits{}, fmt.Errorf("%q: default must be a fraction in [0, 1]", item)
			}
			l.Default = f
			continue
		}
		i := strings.LastIndexByte(item, ':')
		if i <= 0 {
			return ClassLimits{}, fmt.Errorf("%q: want CLASS:LIMIT (e.g. kind=user:0.02) or DIM:LIMIT", item)
		}
		key, v := item[:i], item[i+1:]
		f, err := strconv.ParseFloat(v, 64)
		if err != nil || f < 0 || f > 1 {
			return ClassLimits{}, fmt.Errorf("%q: the limit must be a fraction in [0, 1]", item)
		}
		dim, _, _ := strings.Cut(key, "=")
		if !slices.Contains(Dims, dim) {
			return ClassLimits{}, fmt.Errorf("%q: dimension must be one of %s", item, strings.Join(Dims, ", "))
		}
		l.By[key] = f
	}
	return l, nil
}

// Class verdicts.
const (
	ClassHarm   = "harm"   // the difference is above the limit with confidence: abort, roll back
	ClassSafe   = "safe"   // within the limit with confidence: may step
	ClassUnsure = "unsure" // the interval straddles the limit: wait
	ClassFew    = "few"    // too few decisions to judge
)

// ClassJudged is one class's figures and verdict.
type ClassJudged struct {
	Class
	Paired
	Diff, Lo, Hi, Limit float64
	Confidence          float64 // that the rise is within the limit
	Verdict             string
}

// String formats the class's figures for reasons and audit rows:
// "kind=bot: candidate 79.4 % vs parent 0.2 % of 1200 (+79.2 points, one-sided
// 95.0 % bounds +77.2..+81.1, limit +5.0, confidence 0.0 %)".
func (j ClassJudged) String() string {
	n := float64(max(j.N, 1))
	return fmt.Sprintf("%s: candidate %.1f %% vs parent %.1f %% of %d (%+.1f points, one-sided %s bounds %+.1f..%+.1f, limit %+.1f, confidence %.1f %%)",
		j.Class, 100*float64(j.Cand)/n, 100*float64(j.Parent)/n, j.N, 100*j.Diff, pct(ConfidenceLevel), 100*j.Lo, 100*j.Hi, 100*j.Limit, 100*j.Confidence)
}

// ConfidenceLevel is the one-sided level a class must reach to be judged
// safe (its rise within the limit) or harmful (above it); zConfidence is its
// normal quantile.
const (
	ConfidenceLevel = 0.95
	zConfidence     = 1.6448536269514722
)

// JudgeClasses judges every class: harm when the lower bound of the
// difference is above the class's limit, safe when the upper bound is within
// it, unsure in between, few below minN decisions. The worst come first
// (harm, unsure, safe, few; then by confidence).
func JudgeClasses(classes map[Class]Paired, limits ClassLimits, minN int64) []ClassJudged {
	out := make([]ClassJudged, 0, len(classes))
	for c, p := range classes {
		lo, hi := p.Interval(zConfidence)
		j := ClassJudged{Class: c, Paired: p, Diff: p.Diff(), Lo: lo, Hi: hi, Limit: limits.Of(c)}
		j.Confidence = p.Confidence(j.Limit)
		switch {
		case p.N < minN:
			j.Verdict = ClassFew
		case lo > j.Limit:
			j.Verdict = ClassHarm
		case hi <= j.Limit:
			j.Verdict = ClassSafe
		default:
			j.Verdict = ClassUnsure
		}
		out = append(out, j)
	}
	rank := map[string]int{ClassHarm: 0, ClassUnsure: 1, ClassSafe: 2, ClassFew: 3}
	slices.SortFunc(out, func(a, b ClassJudged) int {
		if rank[a.Verdict] != rank[b.Verdict] {
			return rank[a.Verdict] - rank[b.Verdict]
		}
		if a.Confidence != b.Confidence {
			if a.Confidence < b.Confidence {
				return -1
			}
			return 1
		}
		return strings.Compare(a.Class.String(), b.Class.String())
	})
	return out
}

// ClassesOf returns the classes of the full classes counted (priority, kind,
// plan, route of each decision) summed by dimension.
func ClassesOf(full map[FullClass]Paired) map[Class]Paired {
	out := map[Class]Paired{}
	for fc, p := range full {
		for _, c := range []Class{{DimPriority, fc.Priority}, {DimKind, fc.Kind}, {DimRoute, fc.Route}, {DimPlan, fc.Plan}} {
			out[c] = out[c].Add(p)
		}
	}
	return out
}

// FullClass is one decision's class on every dimension at once, as the
// limiter replicas count them (ImpactClassField).
type FullClass struct{ Priority, Kind, Plan, Route string }

// ImpactClassField is the impact hash field of a full class's count:
// "cls:<n|cand|parent>|<priority>|<kind>|<plan>|<route>" (the route last: it
// may hold ':'; an RFC 3986 path never holds '|').
func ImpactClassField(what string, fc FullClass) string {
	return "cls:" + what + "|" + fc.Priority + "|" + fc.Kind + "|" + fc.Plan + "|" + fc.Route
}

// SlicePrefix marks the class fields of the decisions a candidate answered
// at a step (its slice): ImpactClassField(SlicePrefix+"n", fc), ….
const SlicePrefix = "slice-"

// parseClassField reads an ImpactClassField.
func parseClassField(field string) (what string, fc FullClass, ok bool) {
	rest, ok := strings.CutPrefix(field, "cls:")
	if !ok {
		return "", FullClass{}, false
	}
	parts := strings.SplitN(rest, "|", 5)
	if len(parts) != 5 {
		return "", FullClass{}, false
	}
	return parts[0], FullClass{Priority: parts[1], Kind: parts[2], Plan: parts[3], Route: parts[4]}, true
}
