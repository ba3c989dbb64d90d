package quality

import (
	"encoding/json"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// WriteText writes the report as plain-text tables.
func (r Report) WriteText(w io.Writer) error {
	var b strings.Builder
	c := r.Config
	fmt.Fprintf(&b, "held-out labeled stream: seed %d, %d legitimate + %d abusive principals, %s of event time, %d partitions\n",
		c.Seed, c.Legit, c.Abusive, c.Duration, c.Partitions)
	for _, res := range r.Results {
		fmt.Fprintf(&b, "\n%d detector instance(s): %d events produced in %s, committed by the group %s after the first produce\n",
			res.Instances, res.Events, res.Produce.Round(time.Millisecond), res.Drain.Round(time.Millisecond))
		fmt.Fprintf(&b, "%-20s %-8s %-15s %10s %9s %9s %9s %10s %10s  %s\n", "family", "class", "expected", "principals", "detected", "penalized", "expected%", "p50", "p99", "patterns")
		for _, f := range res.Families {
			class, exp := "legit", "-"
			if f.Abusive {
				class, exp = "abusive", string(f.Pattern)
			}
			asExp := "-"
			if f.Abusive {
				asExp = fmt.Sprintf("%.1f", pct(f.AsExpected, f.Principals))
			}
			fmt.Fprintf(&b, "%-20s %-8s %-15s %10d %9d %9d %9s %10s %10s  %s\n", f.Name, class, exp, f.Principals, f.Detected, f.Penalized, asExp,
				dur(f.LatP50, f.Abusive), dur(f.LatP99, f.Abusive), patterns(f.Patterns))
		}
		for _, p := range res.Patterns {
			fmt.Fprintf(&b, "pattern %-15s %4d abusive principals, %4d penalized, %4d detected as %s, latency p50 %s p99 %s\n",
				p.Pattern, p.Principals, p.Penalized, p.AsExpected, p.Pattern, dur(p.LatP50, true), dur(p.LatP99, true))
		}
		fmt.Fprintf(&b, "recall (an enforced penalty: a key in Redis, or an enforced abuse.v1, published after its write) %.2f %% (%d of %d abusive principals)\n", pct(res.Caught, res.Abusive), res.Caught, res.Abusive)
		fmt.Fprintf(&b, "legitimate principals penalized %d of %d (%.4f %%); with any abuse.v1 event %d\n", res.LegitPenalized, res.Legit, pct(res.LegitPenalized, res.Legit), res.LegitDetected)
		fmt.Fprintf(&b, "detection latency from the abuse start (event time): rate (rapid_fire) p50 %s p99 %s; breadth (distributed_ip: takeover fan-out, botnets, proxy pools, IPv6 rotation) p50 %s p99 %s\n",
			dur(res.RateP50, true), dur(res.RateP99, true), dur(res.FanOutP50, true), dur(res.FanOutP99, true))
		fmt.Fprintf(&b, "harm (the stream through the model limiter with the published penalties, in force %s after each detection):\n", res.Harm.Delay)
		fmt.Fprintf(&b, "%-20s %-8s %10s %18s %28s %24s %9s\n", "family", "class", "penalized", "requests penalized", "legit refused by a penalty", "abusive admitted after", "× allowed")
		for _, f := range res.Harm.Families {
			if f.Abusive {
				fmt.Fprintf(&b, "%-20s %-8s %10d %18d %28s %24d %9.2f\n", f.Name, "abusive", f.Principals, f.Requests, "-", f.AdmittedAfter, f.Ratio())
			} else {
				fmt.Fprintf(&b, "%-20s %-8s %10d %18d %28d %24s %9s\n", f.Name, "legit", f.Principals, f.Requests, f.Refused, "-", "-")
			}
		}
		if len(res.FalseExamples) > 0 {
			fmt.Fprintf(&b, "legitimate principals detected (first %d): %s\n", len(res.FalseExamples), strings.Join(res.FalseExamples, "; "))
		}
	}
	if len(r.Results) > 1 {
		if r.Agree {
			fmt.Fprintf(&b, "\ndetected sets agree across instance counts: yes\n")
		} else {
			fmt.Fprintf(&b, "\ndetected sets agree across instance counts: NO (%d+ differences): %s\n", len(r.Diff), strings.Join(r.Diff, "; "))
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}

// Summary is the report as JSON (what benchreport reads): durations in ms.
type Summary struct {
	Seed       uint64
	Legit      int
	Abusive    int
	Partitions int
	DurationS  float64
	Results    []SummaryResult
	Agree      bool
	Diff       []string
}

// SummaryResult is one pass.
type SummaryResult struct {
	Instances, Events                              int
	ProduceMs, DrainMs                             float64
	Families                                       []SummaryFamily
	Legit, LegitPenalized, LegitDetected           int
	Abusive, Caught                                int
	RateP50Ms, RateP99Ms, FanOutP50Ms, FanOutP99Ms float64
	FalseExamples                                  []string
	Patterns                                       []SummaryPattern
	Harm                                           []SummaryHarm
	HarmDelayMs                                    float64
}

// SummaryHarm is one family's Harm.
type SummaryHarm struct {
	Name                  string
	Abusive               bool
	Principals            int
	Requests, Refused     int64
	AdmittedAfter         int64
	Allowance, AdmitRatio float64
}

// SummaryPattern is the abusive principals of one expected pattern.
type SummaryPattern struct {
	Pattern                           events.Pattern
	Principals, Penalized, AsExpected int
	LatP50Ms, LatP99Ms                float64
}

// SummaryFamily is one family of a pass.
type SummaryFamily struct {
	Name                                        string
	Abusive                                     bool
	Pattern                                     events.Pattern
	Principals, Detected, Penalized, AsExpected int
	LatP50Ms, LatP99Ms                          float64
	Patterns                                    map[events.Pattern]int
}

// Summary returns r for JSON.
func (r Report) Summary() Summary {
	ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
	out := Summary{Seed: r.Config.Seed, Legit: r.Config.Legit, Abusive: r.Config.Abusive, Partitions: r.Config.Partitions,
		DurationS: r.Config.Duration.Seconds(), Agree: r.Agree, Diff: r.Diff}
	for _, x := range r.Results {
		o := SummaryResult{Instances: x.Instances, Events: x.Events, ProduceMs: ms(x.Produce), DrainMs: ms(x.Drain), Legit: x.Legit, LegitPenalized: x.LegitPenalized,
			LegitDetected: x.LegitDetected, Abusive: x.Abusive, Caught: x.Caught, RateP50Ms: ms(x.RateP50), RateP99Ms: ms(x.RateP99),
			FanOutP50Ms: ms(x.FanOutP50), FanOutP99Ms: ms(x.FanOutP99), FalseExamples: x.FalseExamples}
		for _, p := range x.Patterns {
			o.Patterns = append(o.Patterns, SummaryPattern{Pattern: p.Pattern, Principals: p.Principals, Penalized: p.Penalized, AsExpected: p.AsExpected,
				LatP50Ms: ms(p.LatP50), LatP99Ms: ms(p.LatP99)})
		}
		o.HarmDelayMs = ms(x.Harm.Delay)
		for _, h := range x.Harm.Families {
			o.Harm = append(o.Harm, SummaryHarm{Name: h.Name, Abusive: h.Abusive, Principals: h.Principals, Requests: h.Requests, Refused: h.Refused,
				AdmittedAfter: h.AdmittedAfter, Allowance: h.Allowance, AdmitRatio: h.Ratio()})
		}
		for _, f := range x.Families {
			o.Families = append(o.Families, SummaryFamily{Name: f.Name, Abusive: f.Abusive, Pattern: f.Pattern, Principals: f.Principals,
				Detected: f.Detected, Penalized: f.Penalized, AsExpected: f.AsExpected, LatP50Ms: ms(f.LatP50), LatP99Ms: ms(f.LatP99), Patterns: f.Patterns})
		}
		out.Results = append(out.Results, o)
	}
	return out
}

// WriteJSON writes r.Summary() as JSON.
func (r Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", " ")
	return enc.Encode(r.Summary())
}

func pct(a, b int) float64 {
	if b == 0 {
		return 0
	}
	return 100 * float64(a) / float64(b)
}

func dur(d time.Duration, show bool) string {
	if !show || d == 0 {
		return "-"
	}
	return d.Round(10 * time.Millisecond).String()
}

func patterns(m map[events.Pattern]int) string {
	var parts []string
	for _, p := range []events.Pattern{events.PatternRapidFire, events.PatternDistributedIP, events.PatternBotLike, events.PatternCredentialStuffing, events.PatternScraping} {
		if m[p] > 0 {
			parts = append(parts, fmt.Sprintf("%s:%d", p, m[p]))
		}
	}
	for p, n := range m {
		switch p {
		case events.PatternRapidFire, events.PatternDistributedIP, events.PatternBotLike, events.PatternCredentialStuffing, events.PatternScraping:
		default:
			parts = append(parts, fmt.Sprintf("%s:%d", p, n))
		}
	}
	return strings.Join(parts, " ")
}
