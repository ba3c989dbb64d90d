package benchreport

import (
	"fmt"
	"math"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"

	"github.com/floodgate-dev/floodgate/loadtest/bench"
	"github.com/floodgate-dev/floodgate/loadtest/quality"
	"github.com/floodgate-dev/floodgate/pkg/events"

	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
)

// Val is one measured number the report names (in prose, targets, charts).
type Val struct {
	V    float64
	Unit string // "/s", "ms", "s", "B", "%", "events", "" (a count)
}

func (v Val) String() string { return fmtValue(v.V, v.Unit) }

// fmtValue formats v for a reader: rates and counts with thousands
// separators, latencies with three significant digits.
func fmtValue(v float64, unit string) string {
	if math.IsNaN(v) {
		return "n/a"
	}
	if math.IsInf(v, 1) {
		return "∞"
	}
	switch unit {
	case "/s":
		return thousands(v) + "/s"
	case "ms", "s":
		return sig3(v) + " " + unit
	case "B":
		return strconv.FormatFloat(v, 'f', 1, 64) + " B"
	case "%":
		return sig3(v) + " %"
	case "x":
		return sig3(v) + "×"
	case "":
		return thousands(v)
	}
	return sig3(v) + " " + unit
}

func sig3(v float64) string {
	a := math.Abs(v)
	switch {
	case a == 0:
		return "0"
	case a >= 100:
		return thousands(v)
	case a >= 10:
		return strconv.FormatFloat(v, 'f', 1, 64)
	case a >= 1:
		return strconv.FormatFloat(v, 'f', 2, 64)
	}
	return strconv.FormatFloat(v, 'g', 3, 64)
}

func thousands(v float64) string {
	s := strconv.FormatFloat(math.Round(v), 'f', 0, 64)
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	var b strings.Builder
	for i, c := range s {
		if i > 0 && (len(s)-i)%3 == 0 {
			b.WriteByte(',')
		}
		b.WriteRune(c)
	}
	if neg {
		return "-" + b.String()
	}
	return b.String()
}

// fmtUnit formats a benchmark value in its printed unit.
func fmtUnit(v float64, unit string) string {
	switch {
	case unit == "ns/op" && v >= 1e6:
		return sig3(v/1e6) + " ms/op"
	case unit == "ns/op" && v >= 1e4:
		return sig3(v/1e3) + " µs/op"
	case strings.HasSuffix(unit, "/s") && unit != "MB/s":
		return thousands(v)
	case unit == "B/op" || unit == "allocs/op" || unit == "ns/op":
		return thousands(v)
	}
	return sig3(v)
}

var (
	legitLog  = regexp.MustCompile(`(\d+) of (\d+) legitimate principals penalized`)
	recallLog = regexp.MustCompile(`recall (\d+)/(\d+) abusive principals`)
	lagLog    = regexp.MustCompile(`max lag (\d+) events \(([0-9.]+) s of production\)`)
)

// short is a benchmark's name without "Benchmark".
func short(name string) string { return strings.TrimPrefix(name, "Benchmark") }

// extract puts the numbers of a step's results into vals under stable keys.
func extract(r *StepResult, vals map[string]Val) {
	if r.HTTP != nil {
		// Single checks under "http", batches under "httpbatch"; rates in checks/s
		// (requests/s × checks per request), latencies per request.
		prefix, per := "http", float64(max(r.HTTP.Batch, 1))
		if per > 1 {
			prefix = "httpbatch"
		}
		for _, run := range r.HTTP.Runs {
			key := prefix + ".saturation"
			if !run.Closed {
				key = prefix + "@" + strconv.FormatFloat(run.Offered*per, 'f', -1, 64)
			}
			vals[key+".achieved"] = Val{run.Achieved * per, "/s"}
			vals[key+".p50"] = Val{run.P50, "ms"}
			vals[key+".p99"] = Val{run.P99, "ms"}
			vals[key+".p99.9"] = Val{run.P999, "ms"}
			vals[key+".errors"] = Val{float64(run.Errors), ""}
		}
	}
	if q := r.Quality; q != nil {
		// Held-out labeled traffic, per detector instance count n:
		// quality.<n>:recall (fraction), :legitimate, :legit_penalized,
		// :false_positive_rate (%), latencies in ms; quality:agree (1 or 0).
		for _, x := range q.Results {
			k := "quality." + strconv.Itoa(x.Instances) + ":"
			if x.Abusive > 0 {
				vals[k+"recall"] = Val{float64(x.Caught) / float64(x.Abusive), ""}
			}
			vals[k+"abusive"] = Val{float64(x.Abusive), ""}
			vals[k+"legitimate"] = Val{float64(x.Legit), ""}
			vals[k+"legit_penalized"] = Val{float64(x.LegitPenalized), ""}
			if x.Legit > 0 {
				vals[k+"false_positive_rate"] = Val{100 * float64(x.LegitPenalized) / float64(x.Legit), "%"}
			}
			vals[k+"rate_p50_ms"] = Val{x.RateP50Ms, "ms"}
			vals[k+"rate_p99_ms"] = Val{x.RateP99Ms, "ms"}
			vals[k+"fanout_p50_ms"] = Val{x.FanOutP50Ms, "ms"}
			vals[k+"fanout_p99_ms"] = Val{x.FanOutP99Ms, "ms"}
			vals[k+"events"] = Val{float64(x.Events), ""}
		}
		agree := 0.0
		if q.Agree {
			agree = 1
		}
		vals["quality:agree"] = Val{agree, ""}
	}
	if r.Step.Kind == GoTest && r.Err == nil {
		vals["test."+r.Step.ID] = Val{1, ""}
	}
	// A benchmark run with -count N gives N lines; its value is their median, so
	// one slow run on a noisy machine does not make the figure.
	runs := map[string][]float64{}
	for _, b := range r.Bench.Benchmarks {
		name := short(b.Name)
		for _, v := range b.Values {
			unit := ""
			switch {
			case strings.HasSuffix(v.Unit, "/s") && v.Unit != "MB/s":
				unit = "/s"
			case strings.HasSuffix(v.Unit, "_ms"):
				unit = "ms"
			case strings.HasSuffix(v.Unit, "-s"):
				unit = "s"
			case v.Unit == "bytes/principal":
				unit = "B"
			}
			key := name + ":" + v.Unit
			runs[key] = append(runs[key], v.Value)
			vals[key] = Val{median(runs[key]), unit}
		}
		for _, l := range b.Log {
			if m := legitLog.FindStringSubmatch(l); m != nil {
				fp, _ := strconv.ParseFloat(m[1], 64)
				n, _ := strconv.ParseFloat(m[2], 64)
				vals[name+":legitimate"] = Val{n, ""}
				if n > 0 {
					vals[name+":false_positive_rate"] = Val{100 * fp / n, "%"}
				}
			}
			if m := recallLog.FindStringSubmatch(l); m != nil {
				n, _ := strconv.ParseFloat(m[2], 64)
				vals[name+":abusive"] = Val{n, ""}
			}
			if m := lagLog.FindStringSubmatch(l); m != nil {
				s, _ := strconv.ParseFloat(m[2], 64)
				vals[name+":max_lag_s"] = Val{s, "s"}
			}
		}
	}
}

// median is the middle of xs (the mean of the two middle values for an even count).
func median(xs []float64) float64 {
	s := slices.Sorted(slices.Values(xs))
	n := len(s)
	if n%2 == 1 {
		return s[n/2]
	}
	return (s[n/2-1] + s[n/2]) / 2
}

// stepOf returns the result of the step with id in the sections, if it ran.
func stepOf(secs []*SectionResult, id string) *StepResult {
	for _, s := range secs {
		for _, r := range s.Steps {
			if r.Step.ID == id {
				return r
			}
		}
	}
	return nil
}

// benchTable is every result of a go test -bench run, one column per unit.
func benchTable(o Output) string {
	var units []string
	for _, b := range o.Benchmarks {
		for _, v := range b.Values {
			if !slices.Contains(units, v.Unit) {
				units = append(units, v.Unit)
			}
		}
	}
	var b strings.Builder
	b.WriteString("| benchmark | GOMAXPROCS | iterations | " + strings.Join(units, " | ") + " |\n|---|---|---|" + strings.Repeat("---|", len(units)) + "\n")
	for _, bm := range o.Benchmarks {
		fmt.Fprintf(&b, "| %s | %d | %s |", mdEscape(short(bm.Name)), bm.Procs, thousands(float64(bm.Iters)))
		for _, u := range units {
			if v, ok := bm.Get(u); ok {
				b.WriteString(" " + fmtUnit(v, u) + " |")
			} else {
				b.WriteString(" |")
			}
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	return b.String()
}

// benchLogs is the benchmarks' b.Log lines, folded.
func benchLogs(o Output) string {
	var b strings.Builder
	for _, bm := range o.Benchmarks {
		if len(bm.Log) == 0 {
			continue
		}
		fmt.Fprintf(&b, "%s:\n", short(bm.Name))
		for _, l := range bm.Log {
			b.WriteString("    " + l + "\n")
		}
	}
	if b.Len() == 0 {
		return ""
	}
	return "<details><summary>benchmark log</summary>\n\n```\n" + b.String() + "```\n\n</details>\n\n"
}

// qualityTable is the held-out run per family, one column pair per instance count.
func qualityTable(q *quality.Summary) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Seed %d; %s legitimate and %s abusive principals; %s of event time replayed faster than real time into a %d-partition topic.\n\n",
		q.Seed, thousands(float64(q.Legit)), thousands(float64(q.Abusive)), fmtValue(q.DurationS, "s"), q.Partitions)
	b.WriteString("| family | expected | principals |")
	sep := "|---|---|---|"
	for _, x := range q.Results {
		fmt.Fprintf(&b, " %d inst.: penalized | %d inst.: latency p50 / p99 |", x.Instances, x.Instances)
		sep += "---|---|"
	}
	b.WriteString("\n" + sep + "\n")
	if len(q.Results) == 0 {
		return b.String() + "\n"
	}
	for i, f := range q.Results[0].Families {
		exp := "legitimate"
		if f.Abusive {
			exp = string(f.Pattern)
		}
		fmt.Fprintf(&b, "| %s | %s | %s |", f.Name, exp, thousands(float64(f.Principals)))
		for _, x := range q.Results {
			if i >= len(x.Families) {
				b.WriteString(" | |")
				continue
			}
			g := x.Families[i]
			lat := "—"
			if g.Abusive && g.Detected > 0 {
				lat = fmtValue(g.LatP50Ms/1000, "s") + " / " + fmtValue(g.LatP99Ms/1000, "s")
			}
			fmt.Fprintf(&b, " %s%s | %s |", thousands(float64(g.Penalized)), patternNote(g.Patterns), lat)
		}
		b.WriteString("\n")
	}
	b.WriteString("\n")
	for _, x := range q.Results {
		fmt.Fprintf(&b, "- %d instance(s): %s events; recall %s (%d of %d); legitimate principals penalized %d of %s; rate (rapid_fire) p50 / p99 %s / %s; breadth (distributed_ip incl. takeover fan-out) p50 / p99 %s / %s.\n",
			x.Instances, thousands(float64(x.Events)), fmtValue(100*float64(x.Caught)/math.Max(1, float64(x.Abusive)), "%"), x.Caught, x.Abusive,
			x.LegitPenalized, thousands(float64(x.Legit)), fmtValue(x.RateP50Ms/1000, "s"), fmtValue(x.RateP99Ms/1000, "s"),
			fmtValue(x.FanOutP50Ms/1000, "s"), fmtValue(x.FanOutP99Ms/1000, "s"))
		for _, p := range x.Patterns {
			fmt.Fprintf(&b, "  Expected %s: %d of %d penalized, %d detected as %s, latency p50 / p99 %s / %s.\n", p.Pattern, p.Penalized, p.Principals,
				p.AsExpected, p.Pattern, fmtValue(p.LatP50Ms/1000, "s"), fmtValue(p.LatP99Ms/1000, "s"))
		}
		if len(x.FalseExamples) > 0 {
			fmt.Fprintf(&b, "  Legitimate principals detected, first %d: %s.\n", len(x.FalseExamples), mdEscape(strings.Join(x.FalseExamples, "; ")))
		}
	}
	if len(q.Results) > 1 {
		if q.Agree {
			b.WriteString("- The passes detected the same principals with the same first pattern.\n")
		} else {
			fmt.Fprintf(&b, "- The passes **disagree** (first differences): %s.\n", mdEscape(strings.Join(q.Diff, "; ")))
		}
	}
	b.WriteString("\n")
	return b.String()
}

// patternNote lists the patterns detected, e.g. " (rapid_fire 3)".
func patternNote(m map[events.Pattern]int) string {
	if len(m) == 0 {
		return ""
	}
	var parts []string
	for p, n := range m {
		parts = append(parts, fmt.Sprintf("%s %d", p, n))
	}
	sort.Strings(parts)
	return " (" + strings.Join(parts, ", ") + ")"
}

func httpTable(r *bench.Report) string {
	var b strings.Builder
	per := float64(max(r.Batch, 1))
	fmt.Fprintf(&b, "%s per run, %d principals, %s checks per request, %d requests in flight (open loop), %d senders (closed loop). Rates are checks/s; latencies are per request.\n\n",
		fmtValue(r.Duration, "s"), r.Principals, thousands(per), r.Workers, r.SatWorkers)
	b.WriteString("| run | offered checks/s | achieved checks/s | requests | errors | p50 | p90 | p99 | p99.9 | max |\n|---|---|---|---|---|---|---|---|---|---|\n")
	for _, run := range r.Runs {
		offered := "—"
		if !run.Closed {
			offered = thousands(run.Offered * per)
		}
		fmt.Fprintf(&b, "| %s | %s | %s | %s | %s | %s | %s | %s | %s | %s |\n", run.Name, offered, thousands(run.Achieved*per),
			thousands(float64(run.Requests)), thousands(float64(run.Errors)), fmtValue(run.P50, "ms"), fmtValue(run.P90, "ms"),
			fmtValue(run.P99, "ms"), fmtValue(run.P999, "ms"), fmtValue(run.Max, "ms"))
	}
	b.WriteString("\n")
	return b.String()
}

// engineCases are the EngineCheck cases in the order they ran, and the
// checks/s by case and batch.
func engineCases(vals map[string]Val) (cases []string, byBatch map[string][]float64) {
	byBatch = map[string][]float64{}
	var keys []string
	for k := range vals {
		if strings.HasPrefix(k, "EngineCheck/") && strings.HasSuffix(k, ":checks/s") {
			keys = append(keys, k)
		}
	}
	sort.Strings(keys)
	for _, k := range keys {
		name := strings.TrimSuffix(strings.TrimPrefix(k, "EngineCheck/"), ":checks/s")
		c, _, _ := strings.Cut(name, "/")
		if !slices.Contains(cases, c) {
			cases = append(cases, c)
		}
	}
	for _, k := range keys {
		name := strings.TrimSuffix(strings.TrimPrefix(k, "EngineCheck/"), ":checks/s")
		c, batch, _ := strings.Cut(name, "/")
		if byBatch[batch] == nil {
			byBatch[batch] = nanSlice(len(cases))
		}
		byBatch[batch][slices.Index(cases, c)] = vals[k].V
	}
	return cases, byBatch
}

func nanSlice(n int) []float64 {
	s := make([]float64, n)
	for i := range s {
		s[i] = math.NaN()
	}
	return s
}

func get(vals map[string]Val, key string) float64 {
	if v, ok := vals[key]; ok {
		return v.V
	}
	return math.NaN()
}

// peerTable shows Floodgate beside envoy ratelimit (and the do-nothing
// floor when it ran) per protocol, with the ratios per core-second.
func peerTable(p *envoypeer.Report) string {
	var b strings.Builder
	fmt.Fprintf(&b, "%d alternating rounds of %s per service; %d callers (gRPC on %d connections); %s users; the same Redis and rule (100/s fixed window per user).\n",
		p.Rounds, p.Duration, p.Callers, p.Conns, thousands(float64(p.Users)))
	if p.Placement != "" {
		fmt.Fprintf(&b, "Placement: %s. A round whose generator cores were over 90 %% busy is INVALID and left out (unless all were).\n", p.Placement)
	}
	if p.Quota > 0 {
		fmt.Fprintf(&b, "Closed loop: each service ran its rounds under a CPU quota of %.2f core (its own cgroup, 4 ms period), so that its saturation was within the generator's reach; calls per service core-second are calls/s over the CPU it used.\n", p.Quota)
	}
	b.WriteString("\n| protocol | service | calls/s | p50 | p99 | errors | load generator CPU | CPU µs per call: service + Redis + broker + generator | calls per service core-second | cores busy | rounds (invalid) |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, c := range p.Comparisons {
		for _, s := range c.Services {
			busy := make([]string, len(s.CoreBusy))
			for i, v := range s.CoreBusy {
				busy[i] = fmt.Sprintf("cpu%d %.0f %%", i, 100*v)
			}
			inv := fmt.Sprintf("%d (%d)", s.Rounds, s.Invalid)
			if s.AllInvalid {
				inv += " **all invalid**"
			}
			fmt.Fprintf(&b, "| %s | %s | %s | %.2f ms | %.2f ms | %d | %.0f %% | %.1f + %.1f + %.1f + %.1f = %.1f | %s | %s | %s |\n", c.Protocol, s.Name, thousands(s.CallsPerSec),
				s.P50Ms, s.P99Ms, s.Errors, 100*s.LoadgenCPU, s.CPU.Service, s.CPU.Redis, s.CPU.Broker, s.CPU.Generator, s.CPU.Total(),
				thousands(s.PerCoreSecond()), strings.Join(busy, " "), inv)
		}
	}
	b.WriteString("\n")
	for _, c := range p.Comparisons {
		fmt.Fprintf(&b, "- %s: Floodgate / envoy ratelimit = **%.2f×** in calls/s; **%.2f×** per service core-second", c.Protocol, c.Ratio, c.ServiceCPURatio)
		if c.FloorCPURatio > 0 {
			fmt.Fprintf(&b, "; Floodgate's CPU per call is %.2f× the do-nothing floor's", 1/c.FloorCPURatio)
		}
		b.WriteString("\n")
	}
	open := false
	for _, c := range p.Comparisons {
		for _, o := range c.Open {
			if !open {
				b.WriteString("\nOpen loop, every service offered the same rate over alternating rounds (latency from each call's due time):\n\n" +
					"| protocol | service | offered | achieved | p50 | p99 | p99.9 | errors |\n|---|---|---|---|---|---|---|---|\n")
				open = true
			}
			fmt.Fprintf(&b, "| %s | %s | %s/s | %s/s | %.2f ms | %.2f ms | %.2f ms | %d |\n", c.Protocol, o.Name, thousands(o.Offered),
				thousands(o.Achieved), o.P50Ms, o.P99Ms, o.P999Ms, o.Errors)
		}
	}
	return b.String() + "\n"
}
