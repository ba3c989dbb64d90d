// Package tuning turns reviewers' false-positive verdicts into detector
// parameter proposals and proves each on recorded traffic before anyone
// applies it (issue 39, docs/console.md#verdicts): from the false positives
// of one class (pattern, principal kind, route), the parameters of
// score.Config that would have avoided them; each candidate is judged by
// replaying the recorded decision events through the real scorers with the
// candidate configuration, counting the confirmed detections kept and lost
// and the false positives avoided.
//
// It builds on score's exported Config and never changes how score scores:
// parameters are global to the detector today (score.Config has no
// per-route or per-kind thresholds), so a proposal names the class it was
// built from and the global change that avoids it, and its evaluation shows
// what the change costs everywhere else.
package tuning

import (
	"fmt"
	"math"
	"sort"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// Partitions is how many partition scorers a replay runs (the decisions
// topic's partitions; one IP store shared, as the detector's instances do).
const Partitions = 12

// Detections replays ds through Partitions scorers with cfg, partitioned by
// principal as the decisions topic is, and returns each principal's first
// penalizing detection, by principal key.
func Detections(ds []events.Decision, cfg score.Config) map[string]score.Detection {
	ips := score.NewIPStore(cfg)
	var scorers [Partitions]*score.Scorer
	for i := range scorers {
		scorers[i] = score.New(cfg, ips)
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
// pattern on one principal kind (and, when set, one route).
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

// Change is one parameter moved.
type Change struct {
	Param    string // the detector's environment variable
	From, To string
}

// Proposal is a configuration built from the false positives of a class.
type Proposal struct {
	Class   Class
	From    int // false-positive verdicts it was built from
	Changes []Change
	Config  score.Config
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
	avoid   func(base score.Config, fps []score.Detection) (score.Config, string, string, bool)
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

// knobs are the parameters of score.Config a proposal moves, each to just
// past the largest value the false positives reached.
var knobs = []knob{
	{"FLOODGATE_DETECTOR_RAPID_FIRE_THRESHOLD", func(c Class) bool { return c.Pattern == events.PatternRapidFire },
		func(b score.Config, fps []score.Detection) (score.Config, string, string, bool) {
			to := maxOf(fps, func(d score.Detection) float64 { return d.Score }) * 1.05
			old := b.Threshold
			b.Threshold = to
			return b, ftoa(old), ftoa(to), to > old
		}},
	{"FLOODGATE_DETECTOR_RAPID_FIRE_RATE", func(c Class) bool { return c.Pattern == events.PatternRapidFire },
		func(b score.Config, fps []score.Detection) (score.Config, string, string, bool) {
			to := maxOf(fps, func(d score.Detection) float64 { return d.ObservedRate / b.Threshold }) * 1.05
			old := b.Floor
			b.Floor = to
			return b, ftoa(old), ftoa(to), to > old
		}},
	{"FLOODGATE_DETECTOR_PERSON_MIN_DENIALS", func(c Class) bool { return c.Pattern == events.PatternRapidFire && person(c.Kind) },
		func(b score.Config, fps []score.Detection) (score.Config, string, string, bool) {
			to := int(maxOf(fps, func(d score.Detection) float64 { return float64(d.Denials) })) + 1
			old := b.PersonMinDenials
			b.PersonMinDenials = to
			return b, fmt.Sprint(old), fmt.Sprint(to), to > old
		}},
	{"FLOODGATE_DETECTOR_PERSON_DENIAL_RATIO", func(c Class) bool { return c.Pattern == events.PatternRapidFire && person(c.Kind) },
		func(b score.Config, fps []score.Detection) (score.Config, string, string, bool) {
			to := min(1, maxOf(fps, func(d score.Detection) float64 { return d.DenialRatio })+0.01)
			old := b.PersonDenialRatio
			b.PersonDenialRatio = to
			return b, ftoa(old), ftoa(to), to > old
		}},
	{"FLOODGATE_DETECTOR_PERSON_SUSTAIN", func(c Class) bool { return c.Pattern == events.PatternRapidFire && person(c.Kind) },
		func(b score.Config, fps []score.Detection) (score.Config, string, string, bool) {
			width := b.Window / score.NumBuckets
			// whole seconds, as the detector reads it
			to := (time.Duration(maxOf(fps, func(d score.Detection) float64 { return float64(d.Sustained) })) + width + time.Second - 1).Truncate(time.Second)
			old := b.PersonSustain
			b.PersonSustain = to
			return b, old.String(), to.String(), to > old
		}},
	{"FLOODGATE_DETECTOR_AUTOMATED_DENIAL_RATIO", func(c Class) bool { return c.Pattern == events.PatternRapidFire && !person(c.Kind) },
		func(b score.Config, fps []score.Detection) (score.Config, string, string, bool) {
			to := min(1, maxOf(fps, func(d score.Detection) float64 { return d.DenialRatio })+0.01)
			old := b.AutomatedDenialRatio
			b.AutomatedDenialRatio = to
			return b, ftoa(old), ftoa(to), to > old
		}},
	{"FLOODGATE_DETECTOR_IP_MIN_DISTINCT", func(c Class) bool { return c.Pattern == events.PatternDistributedIP },
		func(b score.Config, fps []score.Detection) (score.Config, string, string, bool) {
			to := int(maxOf(fps, func(d score.Detection) float64 { return float64(d.UnsharedIPs) })) + 1
			old := b.MinDistinctIPs
			b.MinDistinctIPs = to
			return b, fmt.Sprint(old), fmt.Sprint(to), to > old
		}},
	{"FLOODGATE_DETECTOR_FANOUT_MIN_NETWORKS", func(c Class) bool { return c.Pattern == events.PatternDistributedIP },
		func(b score.Config, fps []score.Detection) (score.Config, string, string, bool) {
			to := int(maxOf(fps, func(d score.Detection) float64 { return float64(d.NewNetworks) })) + 1
			old := b.FanoutMinNetworks
			b.FanoutMinNetworks = to
			return b, fmt.Sprint(old), fmt.Sprint(to), to > old
		}},
}

// Candidates are the proposals the false positives fps (all of class c)
// suggest: every applicable parameter alone, then every pair, each moved
// just past what the false positives reached; invalid configurations are
// left out.
func Candidates(base score.Config, c Class, fps []score.Detection) []Proposal {
	type move struct {
		ch    Change
		apply func(score.Config) score.Config
	}
	var moves []move
	for _, k := range knobs {
		if !k.applies(c) || len(fps) == 0 {
			continue
		}
		_, from, to, ok := k.avoid(base, fps)
		if !ok {
			continue
		}
		k := k
		moves = append(moves, move{Change{k.param, from, to}, func(cfg score.Config) score.Config {
			out, _, _, _ := k.avoid(cfg, fps)
			return out
		}})
	}
	var out []Proposal
	add := func(ms ...move) {
		cfg := base
		var chs []Change
		for _, m := range ms {
			cfg = m.apply(cfg)
			chs = append(chs, m.ch)
		}
		if cfg.Validate() == nil {
			out = append(out, Proposal{Class: c, From: len(fps), Changes: chs, Config: cfg})
		}
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

// Evaluation is a configuration's replay against the judged detections of
// the base configuration.
type Evaluation struct {
	Confirmed, ConfirmedKept  int // confirmed detections of the base run, and those the candidate still makes
	FalsePositives, FPAvoided int // false-positive detections of the base run, and those the candidate no longer makes
	ClassFPs, ClassFPAvoided  int // of those, the proposal's class
	NewDetections             int // principals the candidate detects that the base did not (unjudged)
	Seconds                   float64
}

// Kept is the share of confirmed detections kept (1 when there were none).
func (e Evaluation) Kept() float64 {
	if e.Confirmed == 0 {
		return 1
	}
	return float64(e.ConfirmedKept) / float64(e.Confirmed)
}

// ClassAvoided is the share of the class's false positives avoided.
func (e Evaluation) ClassAvoided() float64 {
	if e.ClassFPs == 0 {
		return 0
	}
	return float64(e.ClassFPAvoided) / float64(e.ClassFPs)
}

// Evaluate replays ds with cfg and compares it with the verdicts on the base
// run's detections (judged, by principal key).
func Evaluate(ds []events.Decision, cfg score.Config, c Class, judged map[string]Judged) Evaluation {
	began := time.Now()
	got := Detections(ds, cfg)
	var e Evaluation
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
// targets first, then by confirmed detections kept, class false positives
// avoided, and fewer changes.
func Best(ds []events.Decision, cands []Proposal, judged map[string]Judged, t Targets) []Proven {
	out := make([]Proven, 0, len(cands))
	for _, p := range cands {
		e := Evaluate(ds, p.Config, p.Class, judged)
		out = append(out, Proven{Proposal: p, Evaluation: e, Meets: e.Kept() >= t.MinKept && e.ClassAvoided() >= t.MinClassAvoided})
	}
	sort.SliceStable(out, func(i, j int) bool {
		a, b := out[i], out[j]
		if a.Meets != b.Meets {
			return a.Meets
		}
		if a.Evaluation.Kept() != b.Evaluation.Kept() {
			return a.Evaluation.Kept() > b.Evaluation.Kept()
		}
		if a.Evaluation.ClassAvoided() != b.Evaluation.ClassAvoided() {
			return a.Evaluation.ClassAvoided() > b.Evaluation.ClassAvoided()
		}
		return len(a.Proposal.Changes) < len(b.Proposal.Changes)
	})
	return out
}
