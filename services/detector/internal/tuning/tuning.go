// Package tuning turns reviewers' false-positive verdicts into detector
// parameter proposals and proves each on recorded traffic before anyone
// applies it (issue 39, docs/console.md#verdicts): from the false positives
// of one class (pattern, principal kind, route), the parameters of
// score.Config that would have avoided them; each candidate is judged by
// replaying the recorded decision events through the real scorers with the
// candidate configuration, counting the confirmed detections kept and lost
// and the false positives avoided.
//
// A proposal is a detector parameters document (score.Params,
// docs/detector.md): the parameters in force with the class's override —
// its principal kind, and its route when the class names one — moved just
// past what the false positives reached, so nothing outside the class
// changes; its evaluation replays everything and shows what it costs.
package tuning

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// Partitions is how many partition scorers a replay runs (the decisions
// topic's partitions; one IP store shared, as the detector's instances do).
const Partitions = 12

// Detections replays ds through Partitions scorers with cfg and the
// parameters tu (nil: cfg alone), partitioned by principal as the decisions
// topic is, and returns each principal's first penalizing detection, by
// principal key.
func Detections(ds []events.Decision, cfg score.Config, tu *score.Tuned) map[string]score.Detection {
	ips := score.NewIPStore(cfg)
	var scorers [Partitions]*score.Scorer
	for i := range scorers {
		scorers[i] = score.New(cfg, ips)
		scorers[i].SetTuned(tu)
	}
	first := map[string]score.Detection{}
	var out []score.Detection
	for i := range ds {
		out = scorers[fnv(ds[i].Principal.Key())%Partitions].Observe(&ds[i], out[:0])
		for _, det := range out {
			if _, ok := first[det.Principal.Key()]; !ok && det.Penalize {
				first[det.Principal.Key()] = det
			}
		}
	}
	return first
}

func fnv(s string) uint32 {
	h := uint32(2166136261)
	for i := 0; i < len(s); i++ {
		h ^= uint32(s[i])
		h *= 16777619
	}
	return h
}

// Judged is one detection with a reviewer's verdict.
type Judged struct {
	Detection score.Detection
	Verdict   events.VerdictValue
}

// Class is what a proposal is built for: the false positives of one
// pattern on one principal kind (its family), and, when set, the one route
// template they concentrate on — the proposal is then an override of the
// kind on that route, and leaves the kind's other routes alone.
type Class struct {
	Pattern events.Pattern
	Kind    events.PrincipalKind
	Route   string // "" = every route
}

func (c Class) String() string {
	s := string(c.Pattern) + "/" + string(c.Kind)
	if c.Route != "" {
		s += " on " + c.Route
	}
	return s
}

// Has reports whether d is of the class.
func (c Class) Has(d score.Detection) bool {
	return d.Pattern == c.Pattern && d.Principal.Kind == c.Kind && (c.Route == "" || d.Route == c.Route)
}

// Family is the class on every route: the pattern on the kind. A
// proposal's evaluation counts the false positives of its family, whatever
// its route, so a route override is judged on all the false positives the
// reviewers found, not only those on its route.
func (c Class) Family() Class { return Class{Pattern: c.Pattern, Kind: c.Kind} }

// concentrated is the route template holding at least share of fps (""
// when none does). A person's window over all routes (score.AllRoutes) is
// not a route: no route override reaches it.
func concentrated(fps []score.Detection, share float64) string {
	n := map[string]int{}
	for _, d := range fps {
		if d.Route != "" && d.Route != score.AllRoutes {
			n[d.Route]++
		}
	}
	for r, k := range n {
		if float64(k) >= share*float64(len(fps)) {
			return r
		}
	}
	return ""
}

// onRoute is the detections of fps on route.
func onRoute(fps []score.Detection, route string) []score.Detection {
	var out []score.Detection
	for _, d := range fps {
		if d.Route == route {
			out = append(out, d)
		}
	}
	return out
}

// Change is one parameter moved.
type Change struct {
	Param    string // the parameters document's name (score.KnobEnv)
	From, To string
}

// Proposal is a parameters document built from the false positives of a
// class: the document in force with the class's override moved.
type Proposal struct {
	Class   Class
	From    int // false-positive verdicts it was built from
	Changes []Change
	Params  score.Params
	Tuned   *score.Tuned
	Rounds  int // how many times its parameters were moved further (0: just past the false positives)
}

func (p Proposal) String() string {
	parts := make([]string, 0, len(p.Changes))
	for _, c := range p.Changes {
		parts = append(parts, fmt.Sprintf("%s %s → %s", c.Param, c.From, c.To))
	}
	return strings.Join(parts, ", ")
}

// knob is one parameter a proposal may move: whether it applies to a class,
// and the value that would have kept every given false positive under it
// (ok false when moving it cannot avoid them or it is already there).
type knob struct {
	param   string
	applies func(Class) bool
	avoid   func(base score.Config, fps []score.Detection) (from, to string, ok bool)
}

// at is the class's configuration under tu: its kind's, on its route.
func (c Class) at(tu *score.Tuned) score.Config {
	route := c.Route
	if route == "" {
		route = score.AllRoutes
	}
	return tu.Config(c.Kind, route)
}

func person(k events.PrincipalKind) bool {
	return k == events.PrincipalUser || k == events.PrincipalAnonymous
}

func maxOf(fps []score.Detection, f func(score.Detection) float64) float64 {
	m := math.Inf(-1)
	for _, d := range fps {
		m = max(m, f(d))
	}
	return m
}

func ftoa(f float64) string { return fmt.Sprintf("%.4g", f) }

// thresholdReached is the rapid-fire threshold detection d went past. A
// person's score is judged against it; automation's score is measured
// against its limit (the denial ratio's line), and the threshold only
// decides whether its rate counts at all (above Floor × Threshold), so
// there it is the rate over the floor.
func thresholdReached(b score.Config, d score.Detection) float64 {
	if person(d.Principal.Kind) || b.Floor <= 0 {
		return d.Score
	}
	return d.ObservedRate / b.Floor
}

// knobs are the parameters of score.Config a proposal moves, each to just
// past the largest value the false positives reached.
var knobs = []knob{
	{"rapid_fire_threshold", func(c Class) bool { return c.Pattern == events.PatternRapidFire },
		func(b score.Config, fps []score.Detection) (string, string, bool) {
			to := maxOf(fps, func(d score.Detection) float64 { return thresholdReached(b, d) }) * 1.05
			return ftoa(b.Threshold), ftoa(to), to > b.Threshold
		}},
	{"rapid_fire_rate", func(c Class) bool { return c.Pattern == events.PatternRapidFire },
		func(b score.Config, fps []score.Detection) (string, string, bool) {
			to := maxOf(fps, func(d score.Detection) float64 { return d.ObservedRate / b.Threshold }) * 1.05
			return ftoa(b.Floor), ftoa(to), to > b.Floor
		}},
	{"person_min_denials", func(c Class) bool { return c.Pattern == events.PatternRapidFire && person(c.Kind) },
		func(b score.Config, fps []score.Detection) (string, string, bool) {
			to := int(maxOf(fps, func(d score.Detection) float64 { return float64(d.Denials) })) + 1
			return fmt.Sprint(b.PersonMinDenials), fmt.Sprint(to), to > b.PersonMinDenials
		}},
	{"person_denial_ratio", func(c Class) bool { return c.Pattern == events.PatternRapidFire && person(c.Kind) },
		func(b score.Config, fps []score.Detection) (string, string, bool) {
			to := min(1, maxOf(fps, func(d score.Detection) float64 { return d.DenialRatio })+0.01)
			return ftoa(b.PersonDenialRatio), ftoa(to), to > b.PersonDenialRatio
		}},
	{"person_sustain", func(c Class) bool { return c.Pattern == events.PatternRapidFire && person(c.Kind) },
		func(b score.Config, fps []score.Detection) (string, string, bool) {
			width := b.Window / score.NumBuckets
			// whole seconds, as the detector reads it
			to := (time.Duration(maxOf(fps, func(d score.Detection) float64 { return float64(d.Sustained) })) + width + time.Second - 1).Truncate(time.Second)
			return b.PersonSustain.String(), to.String(), to > b.PersonSustain
		}},
	{"automated_denial_ratio", func(c Class) bool { return c.Pattern == events.PatternRapidFire && !person(c.Kind) },
		func(b score.Config, fps []score.Detection) (string, string, bool) {
			to := min(1, maxOf(fps, func(d score.Detection) float64 { return d.DenialRatio })+0.01)
			return ftoa(b.AutomatedDenialRatio), ftoa(to), to > b.AutomatedDenialRatio
		}},
	{"ip_min_distinct", func(c Class) bool { return c.Pattern == events.PatternDistributedIP },
		func(b score.Config, fps []score.Detection) (string, string, bool) {
			to := int(maxOf(fps, func(d score.Detection) float64 { return float64(d.UnsharedIPs) })) + 1
			return fmt.Sprint(b.MinDistinctIPs), fmt.Sprint(to), to > b.MinDistinctIPs
		}},
	{"fanout_min_networks", func(c Class) bool { return c.Pattern == events.PatternDistributedIP },
		func(b score.Config, fps []score.Detection) (string, string, bool) {
			to := int(maxOf(fps, func(d score.Detection) float64 { return float64(d.NewNetworks) })) + 1
			return fmt.Sprint(b.FanoutMinNetworks), fmt.Sprint(to), to > b.FanoutMinNetworks
		}},
}

// Candidates are the proposals the false positives fps (all of class c)
// suggest over the parameters cur in force (compiled over base): every
// applicable parameter alone, then every pair, each moved just past what
// the false positives reached in the class's override; documents that do
// not compile are left out.
func Candidates(base score.Config, cur score.Params, c Class, fps []score.Detection) []Proposal {
	curTuned, err := score.Compile(base, cur, 0)
	if err != nil || len(fps) == 0 {
		return nil
	}
	at := c.at(curTuned)
	var moves []Change
	for _, k := range knobs {
		if !k.applies(c) {
			continue
		}
		if from, to, ok := k.avoid(at, fps); ok {
			moves = append(moves, Change{k.param, from, to})
		}
	}
	var out []Proposal
	add := func(chs ...Change) {
		p := withOverride(cur, c, chs)
		if p.err != nil {
			return
		}
		tu, err := score.Compile(base, p.params, 0)
		if err != nil {
			return
		}
		out = append(out, Proposal{Class: c, From: len(fps), Changes: chs, Params: p.params, Tuned: tu})
	}
	for _, m := range moves {
		add(m)
	}
	for i := range moves {
		for j := i + 1; j < len(moves); j++ {
			add(moves[i], moves[j])
		}
	}
	return out
}

// further moves each of p's parameters Spread^round times as far from
// the value in force as p moved it (a ratio at most 0.99, a duration in
// whole seconds, a count rounded up); false when the document does not
// compile (a value past its range).
func further(base score.Config, cur score.Params, p Proposal, round int) (Proposal, bool) {
	f := math.Pow(Spread, float64(round))
	chs := make([]Change, 0, len(p.Changes))
	for _, ch := range p.Changes {
		to, ok := stretch(ch, f)
		if !ok {
			return p, false
		}
		chs = append(chs, Change{ch.Param, ch.From, to})
	}
	b := withOverride(cur, p.Class, chs)
	if b.err != nil {
		return p, false
	}
	tu, err := score.Compile(base, b.params, 0)
	if err != nil {
		return p, false
	}
	return Proposal{Class: p.Class, From: p.From, Changes: chs, Params: b.params, Tuned: tu, Rounds: round}, true
}

// Spread is how much further each refinement moves a parameter.
const Spread = 4

// stretch is ch's To moved f times as far from its From.
func stretch(ch Change, f float64) (string, bool) {
	if from, err := time.ParseDuration(ch.From); err == nil {
		to, err := time.ParseDuration(ch.To)
		if err != nil {
			return "", false
		}
		return (from + time.Duration(float64(to-from)*f) + time.Second - 1).Truncate(time.Second).String(), true
	}
	from, err1 := strconv.ParseFloat(ch.From, 64)
	to, err2 := strconv.ParseFloat(ch.To, 64)
	if err1 != nil || err2 != nil {
		return "", false
	}
	v := from + (to-from)*f
	switch {
	case strings.HasSuffix(ch.Param, "_ratio"):
		v = min(v, 0.99)
	case !strings.ContainsAny(ch.From+ch.To, ".e"): // a count
		return strconv.Itoa(int(math.Ceil(v))), true
	}
	return ftoa(v), true
}

type built struct {
	params score.Params
	err    error
}

// withOverride copies cur with the changes set in the override of c's kind
// and route (added when cur has none).
func withOverride(cur score.Params, c Class, chs []Change) built {
	p := score.Params{Defaults: cur.Defaults, Overrides: append([]score.Override(nil), cur.Overrides...)}
	i := -1
	for j, o := range p.Overrides {
		if o.Kind == c.Kind && o.Route == c.Route {
			i = j
		}
	}
	if i < 0 {
		p.Overrides = append(p.Overrides, score.Override{Kind: c.Kind, Route: c.Route})
		i = len(p.Overrides) - 1
	}
	for _, ch := range chs {
		if err := p.Overrides[i].Set(ch.Param, ch.To); err != nil {
			return built{err: err}
		}
	}
	return built{params: p}
}

// Evaluation is a configuration's replay against the judged detections of
// the base configuration: the counts a stored proposal carries (the base
// run's confirmed detections and those the candidate still makes, its
// false-positive detections and those the candidate no longer makes, the
// class's, and the principals only the candidate detects), and how long it
// took.
type Evaluation struct {
	dynamo.Evidence
	Seconds float64
}

// Evaluate replays ds with cfg and compares it with the verdicts on the base
// run's detections (judged, by principal key); the class's false positives
// are those of its family (c.Family()).
func Evaluate(ds []events.Decision, cfg score.Config, tu *score.Tuned, c Class, judged map[string]Judged) Evaluation {
	began := time.Now()
	got := Detections(ds, cfg, tu)
	var e Evaluation
	c = c.Family()
	for k, j := range judged {
		_, still := got[k]
		switch j.Verdict {
		case events.VerdictConfirmed:
			e.Confirmed++
			if still {
				e.ConfirmedKept++
			}
		case events.VerdictFalsePositive:
			e.FalsePositives++
			if !still {
				e.FPAvoided++
			}
			if c.Has(j.Detection) {
				e.ClassFPs++
				if !still {
					e.ClassFPAvoided++
				}
			}
		}
	}
	for k := range got {
		if _, ok := judged[k]; !ok {
			e.NewDetections++
		}
	}
	e.Seconds = time.Since(began).Seconds()
	return e
}

// Targets are what a proposal must prove on replay.
type Targets struct {
	MinClassAvoided float64 // share of the class's false positives avoided, e.g. 0.9
	MinKept         float64 // share of confirmed detections kept, e.g. 0.995
}

// Proven is a proposal with its evaluation.
type Proven struct {
	Proposal   Proposal
	Evaluation Evaluation
	Meets      bool
}

// Best evaluates every candidate and returns them ranked: those meeting the
// targets first, then by confirmed detections kept, then a route override
// before a kind's (it changes less of what nobody judged), then by the
// family's false positives avoided, fewer changes, and parameters moved
// less far (Proposal.Rounds).
func Best(ds []events.Decision, base score.Config, cands []Proposal, judged map[string]Judged, t Targets) []Proven {
	return best(ds, base, cands, judged, t, nil)
}

// Refinements is how many times a candidate is moved again past the false
// positives it still makes before it is ranked as it is.
const Refinements = 3

// best is Best; with refine set, a candidate that leaves some of its
// family's false positives is also moved further (refine's round 1, 2, …,
// up to Refinements; false when it cannot move that far), and each move
// that avoids more of them than the last is ranked beside it: a detection
// shows where a behaviour crossed the line, not how far it goes on past it
// (a burst whose rate keeps rising after its first detection), so a
// parameter moved just past the detection is crossed again a moment later.
func best(ds []events.Decision, base score.Config, cands []Proposal, judged map[string]Judged, t Targets,
	refine func(p Proposal, round int) (Proposal, bool)) []Proven {
	judge := func(p Proposal) Proven {
		e := Evaluate(ds, base, p.Tuned, p.Class, judged)
		return Proven{Proposal: p, Evaluation: e, Meets: e.KeptShare() >= t.MinKept && e.ClassAvoidedShare() >= t.MinClassAvoided}
	}
	out := make([]Proven, 0, len(cands))
	for _, p := range cands {
		pr := judge(p)
		out = append(out, pr)
		for i := 1; refine != nil && i <= Refinements && pr.Evaluation.ClassFPAvoided < pr.Evaluation.ClassFPs; i++ {
			q, ok := refine(p, i)
			if !ok {
				break
			}
			if qr := judge(q); qr.Evaluation.ClassFPAvoided > pr.Evaluation.ClassFPAvoided {
				out = append(out, qr)
				pr = qr
			}
		}
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Meets != b.Meets {
			return a.Meets
		}
		if a.Evaluation.KeptShare() != b.Evaluation.KeptShare() {
			return a.Evaluation.KeptShare() > b.Evaluation.KeptShare()
		}
		if narrow := a.Proposal.Class.Route != ""; narrow != (b.Proposal.Class.Route != "") {
			return narrow
		}
		if a.Evaluation.ClassAvoidedShare() != b.Evaluation.ClassAvoidedShare() {
			return a.Evaluation.ClassAvoidedShare() > b.Evaluation.ClassAvoidedShare()
		}
		if len(a.Proposal.Changes) != len(b.Proposal.Changes) {
			return len(a.Proposal.Changes) < len(b.Proposal.Changes)
		}
		return a.Proposal.Rounds < b.Proposal.Rounds
	})
	return out
}

// Verdicted is one reviewer verdict on a principal's detection, as stored.
type Verdicted struct {
	Principal string // kind:id
	Verdict   events.VerdictValue
}

// Built is the best proposal of one class with its evaluation.
type Built struct {
	Proven
	Decisions int
}

// Propose builds, for every class with at least minFPs false-positive
// verdicts, the best proposal over the parameters cur in force (compiled
// over base), proven by replaying ds: each verdict judges the principal's
// detection replayed with the parameters in force (a verdict whose
// principal the replay does not detect is left out: the recording does not
// hold its detection). Classes are a pattern on a principal kind; when at
// least t.MinClassAvoided of a class's false positives are on one route
// template, the candidates of an override of the kind on that route are
// ranked beside the kind's (the route's false positives alone set them),
// all evaluated on the class's false positives. Results are ordered by
// class.
func Propose(ds []events.Decision, base score.Config, cur score.Params, verdicts []Verdicted, minFPs int, t Targets) ([]Built, error) {
	curTuned, err := score.Compile(base, cur, 0)
	if err != nil {
		return nil, fmt.Errorf("the parameters in force: %w", err)
	}
	dets := Detections(ds, base, curTuned)
	judged := map[string]Judged{}
	for _, v := range verdicts {
		if d, ok := dets[v.Principal]; ok && (v.Verdict == events.VerdictConfirmed || v.Verdict == events.VerdictFalsePositive) {
			judged[v.Principal] = Judged{Detection: d, Verdict: v.Verdict}
		}
	}
	byClass := map[Class][]score.Detection{}
	for _, j := range judged {
		if j.Verdict == events.VerdictFalsePositive {
			c := Class{Pattern: j.Detection.Pattern, Kind: j.Detection.Principal.Kind}
			byClass[c] = append(byClass[c], j.Detection)
		}
	}
	classes := make([]Class, 0, len(byClass))
	for c, fps := range byClass {
		if len(fps) >= max(minFPs, 1) {
			classes = append(classes, c)
		}
	}
	sort.Slice(classes, func(i, j int) bool { return classes[i].String() < classes[j].String() })
	var out []Built
	for _, c := range classes {
		fps := byClass[c]
		sort.Slice(fps, func(i, j int) bool { return fps[i].Principal.Key() < fps[j].Principal.Key() })
		cands := Candidates(base, cur, c, fps)
		if r := concentrated(fps, t.MinClassAvoided); r != "" {
			rc := c
			rc.Route = r
			cands = append(cands, Candidates(base, cur, rc, onRoute(fps, r))...)
		}
		ranked := best(ds, base, cands, judged, t, func(p Proposal, round int) (Proposal, bool) { return further(base, cur, p, round) })
		if len(ranked) == 0 {
			continue
		}
		out = append(out, Built{Proven: ranked[0], Decisions: len(ds)})
	}
	return out, nil
}
