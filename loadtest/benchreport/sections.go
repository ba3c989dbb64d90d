package benchreport

import (
	"fmt"
	"math"
	"sort"
	"strconv"
	"strings"
)

// Targets (the issues' targets, stated in docs/benchmarks.md).
const (
	targetP99At10kMs    = 2.0
	targetChecksPerS    = 40_000
	batchChecks         = 100 // checks per request of the batch-endpoint run (the limiter's MaxBatch)
	refEnvoyChecksPerS  = 12_000
	refEnvoyP99Ms       = 18
	targetScorePerCore  = 500_000
	targetE2EEventsPerS = 100_000
	targetDetectP99Ms   = 2_000
	targetBytesPerPrinc = 300
	targetRecall        = 0.995
	targetFalsePosPct   = 0.001
	targetPeerRatio     = 3.0 // issue 15: three times envoy ratelimit, side by side
	// Issue 34, pinned runs (peerbench -pin): per service core-second, gRPC
	// 3× and HTTP 2× envoy ratelimit's, each within 1.5× of the do-nothing
	// floor's CPU per call.
	targetPeerCoreGRPC = 3.0
	targetPeerCoreHTTP = 2.0
	targetFloorFactor  = 1.5
)

// qualityInstances are the detector instance counts of the held-out run, ascending.
func qualityInstances(vals map[string]Val) []int {
	var out []int
	for _, k := range keysWith(vals, "quality.", ":legitimate") {
		if n, err := strconv.Atoi(strings.TrimSuffix(strings.TrimPrefix(k, "quality."), ":legitimate")); err == nil {
			out = append(out, n)
		}
	}
	sort.Ints(out)
	return out
}

// keysWith returns the keys of vals with prefix and suffix, sorted.
func keysWith(vals map[string]Val, prefix, suffix string) []string {
	var out []string
	for k := range vals {
		if strings.HasPrefix(k, prefix) && strings.HasSuffix(k, suffix) {
			out = append(out, k)
		}
	}
	sort.Strings(out)
	return out
}

// httpRates returns the open-loop offered rates (checks/s) measured by the
// loadgen runs under prefix ("http" or "httpbatch"), ascending.
func httpRates(vals map[string]Val, prefix string) []float64 {
	var rates []float64
	for _, k := range keysWith(vals, prefix+"@", ".achieved") {
		r, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimPrefix(k, prefix+"@"), ".achieved"), 64)
		if err == nil {
			rates = append(rates, r)
		}
	}
	sort.Float64s(rates)
	return rates
}

func rateKey(prefix string, r float64) string {
	return prefix + "@" + strconv.FormatFloat(r, 'f', -1, 64)
}

// charts are the report's plots by file name.
func charts(vals map[string]Val, secs []*SectionResult) map[string]Chart {
	out := map[string]Chart{}

	rates := httpRates(vals, "http")
	lat := LineChart{Title: "Limiter over HTTP: latency against offered load", XLabel: "offered load (checks/s)",
		YLabel: "latency (ms, from the intended send time)", LogX: true, LogY: true,
		Refs: []Ref{{fmt.Sprintf("target: p99 ≤ %g ms at 10k checks/s", targetP99At10kMs), targetP99At10kMs}}}
	for _, q := range []string{"p50", "p99", "p99.9"} {
		s := Series{Name: q + " (open loop)"}
		for _, r := range rates {
			s.X, s.Y = append(s.X, r), append(s.Y, get(vals, rateKey("http", r)+"."+q))
		}
		lat.Series = append(lat.Series, s)
	}
	if sat, ok := vals["http.saturation.achieved"]; ok {
		lat.Series = append(lat.Series, Series{Name: "p99 at saturation (closed loop, at its achieved rate)", Points: true,
			X: []float64{sat.V}, Y: []float64{get(vals, "http.saturation.p99")}})
	}
	out["limiter-latency.svg"] = lat

	thr := LineChart{Title: "Limiter over HTTP: throughput", XLabel: "offered load (checks/s)", YLabel: "achieved (checks/s)",
		Series: []Series{{Name: "achieved (open loop)"}, {Name: "offered (every check answered)"}},
		Refs: []Ref{{fmt.Sprintf("target: ≥ %s checks/s sustained", thousands(targetChecksPerS)), targetChecksPerS},
			{fmt.Sprintf("envoyproxy/ratelimit reference: ~%s checks/s", thousands(refEnvoyChecksPerS)), refEnvoyChecksPerS}}}
	for _, r := range rates {
		thr.Series[0].X, thr.Series[0].Y = append(thr.Series[0].X, r), append(thr.Series[0].Y, get(vals, rateKey("http", r)+".achieved"))
		thr.Series[1].X, thr.Series[1].Y = append(thr.Series[1].X, r), append(thr.Series[1].Y, r)
	}
	if sat, ok := vals["http.saturation.achieved"]; ok {
		thr.Refs = append([]Ref{{"saturation (closed loop): " + sat.String(), sat.V}}, thr.Refs...)
	}
	if brates := httpRates(vals, "httpbatch"); len(brates) > 0 {
		s := Series{Name: fmt.Sprintf("achieved, batch endpoint (%d checks/request)", batchChecks)}
		for _, r := range brates {
			s.X, s.Y = append(s.X, r), append(s.Y, get(vals, rateKey("httpbatch", r)+".achieved"))
		}
		thr.Series = append(thr.Series, s)
	}
	if sat, ok := vals["httpbatch.saturation.achieved"]; ok {
		thr.Refs = append([]Ref{{"batch endpoint saturation: " + sat.String(), sat.V}}, thr.Refs...)
	}
	out["limiter-throughput.svg"] = thr

	cases, byBatch := engineCases(vals)
	eng := BarChart{Title: "In-process engine against Redis (no HTTP)", ValueLabel: "checks/s", Horizontal: true,
		Refs: []Ref{{fmt.Sprintf("target: %s checks/s", thousands(targetChecksPerS)), targetChecksPerS}}}
	var shown []int // the cache-hit case never reaches Redis and dwarfs the rest: table only
	for i, c := range cases {
		if c != "over-limit-cache-hit" {
			shown = append(shown, i)
			eng.Categories = append(eng.Categories, c)
		}
	}
	var batches []string
	for b := range byBatch {
		batches = append(batches, b)
	}
	sort.Slice(batches, func(i, j int) bool { return batchN(batches[i]) < batchN(batches[j]) })
	for _, b := range batches {
		g := BarGroup{Name: b}
		for _, i := range shown {
			g.Values = append(g.Values, byBatch[b][i])
		}
		eng.Groups = append(eng.Groups, g)
	}
	if v, ok := vals["EnvoyShouldRateLimit:checks/s"]; ok {
		eng.Categories = append(eng.Categories, "envoy-rls-grpc")
		for i := range eng.Groups {
			eng.Groups[i].Values = append(eng.Groups[i].Values, math.NaN())
		}
		eng.Groups = append(eng.Groups, BarGroup{Name: "Envoy ShouldRateLimit over gRPC", Values: append(nanSlice(len(eng.Categories)-1), v.V)})
	}
	out["limiter-engine.svg"] = eng

	stages := pipelineStages(vals)
	pt := BarChart{Title: "Pipeline throughput", ValueLabel: "events/s (messages/s for the Kafka loops)", Horizontal: true}
	g := BarGroup{}
	for _, s := range stages {
		if !math.IsNaN(s.rate) {
			pt.Categories = append(pt.Categories, s.short)
			g.Values = append(g.Values, s.rate)
		}
	}
	pt.Groups = []BarGroup{g}
	out["pipeline-throughput.svg"] = pt

	// One bar per measurement (grouped bars misalign when a category lacks a
	// statistic); short labels, the table below has the full names.
	lag := BarChart{Title: "Pipeline lag", ValueLabel: "seconds", Horizontal: true}
	var lg BarGroup
	for _, k := range keysWith(vals, "Ledger/steady", ":lag-p99-s") {
		name := strings.TrimSuffix(k, ":lag-p99-s")
		for _, st := range []struct{ label, key string }{{"p50", ":lag-p50-s"}, {"p99", ":lag-p99-s"}, {"max bucket", ":lag-max-bucket-s"}} {
			lag.Categories = append(lag.Categories, "ledger steady: "+st.label)
			lg.Values = append(lg.Values, get(vals, name+st.key))
		}
	}
	if v, ok := vals["BrokerThroughput:max_lag_s"]; ok {
		lag.Categories = append(lag.Categories, "detector live: max")
		lg.Values = append(lg.Values, v.V)
	}
	lag.Groups = []BarGroup{lg}
	out["pipeline-lag.svg"] = lag

	out["detector-latency.svg"] = BarChart{Title: "Detection latency: crossing event → penalty in Redis", ValueLabel: "ms",
		Categories: []string{"p50", "p99"},
		Groups:     []BarGroup{{Name: "measured", Values: []float64{get(vals, "BrokerLatency:p50_ms"), get(vals, "BrokerLatency:p99_ms")}}},
		Refs:       []Ref{{fmt.Sprintf("target: p99 ≤ %s ms", thousands(targetDetectP99Ms)), targetDetectP99Ms}}}

	// Detection quality: the held-out run through 1 and N instances.
	qc := DotChart{Title: "Detection quality on held-out labeled traffic", ValueLabel: "% of principals",
		Categories: []string{"abusive penalized (recall)", "legitimate left alone"}, Max: 100.2}
	lo := 99.0 // the axis starts 1 % below the lowest value, at 99 % at most
	for _, n := range qualityInstances(vals) {
		k := "quality." + strconv.Itoa(n) + ":"
		recall, fpr := 100*get(vals, k+"recall"), get(vals, k+"false_positive_rate")
		for _, v := range []float64{recall, 100 - fpr} {
			if !math.IsNaN(v) {
				lo = math.Min(lo, math.Floor(v)-1)
			}
		}
		qc.Series = append(qc.Series, BarGroup{Name: fmt.Sprintf("%d detector instance(s)", n), Values: []float64{recall, 100 - fpr}})
	}
	qc.Min = math.Max(0, lo)
	qc.Series = append(qc.Series, BarGroup{Name: fmt.Sprintf("target (recall ≥ %g %%, false positives ≤ %g %%)", 100*targetRecall, targetFalsePosPct),
		Values: []float64{100 * targetRecall, 100 - targetFalsePosPct}})
	out["detector-quality.svg"] = qc

	if r := stepOf(secs, "detector-quality"); r != nil && r.Quality != nil && len(r.Quality.Results) > 0 {
		ql := BarChart{Title: "Detection latency from the abuse start (event time), held-out traffic", ValueLabel: "s", Horizontal: true,
			Refs: []Ref{{"target: fan-out ≤ 10 s", 10}, {"target: rate ≤ 2 s", 2}}}
		x := r.Quality.Results[len(r.Quality.Results)-1]
		p50, p99 := BarGroup{Name: fmt.Sprintf("p50, %d instance(s)", x.Instances)}, BarGroup{Name: fmt.Sprintf("p99, %d instance(s)", x.Instances)}
		for _, f := range x.Families {
			if !f.Abusive {
				continue
			}
			ql.Categories = append(ql.Categories, f.Name)
			v50, v99 := math.NaN(), math.NaN()
			if f.Detected > 0 {
				v50, v99 = f.LatP50Ms/1000, f.LatP99Ms/1000
			}
			p50.Values, p99.Values = append(p50.Values, v50), append(p99.Values, v99)
		}
		ql.Groups = []BarGroup{p50, p99}
		out["detector-quality-latency.svg"] = ql
	}

	lw := BarChart{Title: "Quota ledger: DynamoDB writes per million events", ValueLabel: "UpdateItem calls per 1M events", Horizontal: true}
	var wg BarGroup
	for _, k := range keysWith(vals, "Ledger/", ":writes/1M-events") {
		lw.Categories = append(lw.Categories, strings.TrimSuffix(strings.TrimPrefix(k, "Ledger/"), ":writes/1M-events"))
		wg.Values = append(wg.Values, vals[k].V)
	}
	lw.Groups = []BarGroup{wg}
	out["ledger-writes.svg"] = lw
	return out
}

func batchN(s string) int {
	n, _ := strconv.Atoi(strings.TrimPrefix(s, "batch="))
	return n
}

type stage struct {
	name, short string
	rate        float64
}

// pipelineStages are the throughput numbers of the pipeline, in flow order.
func pipelineStages(vals map[string]Val) []stage {
	var out []stage
	add := func(name, short, key string) {
		out = append(out, stage{name: name, short: short, rate: get(vals, key)})
	}
	add("decode a decision event (pkg/events, one core)", "decode (1 core)", "DecodeDecision/floodgate:events/s")
	add("reliable producer, acks=all (pkg/stream, in-process broker)", "producer", "ProducerThroughput:msgs/s")
	add("async producer (pkg/stream)", "async producer", "AsyncProducerThroughput:msgs/s")
	add("consumer group loop (pkg/stream)", "consumer", "ConsumerThroughput:msgs/s")
	add("detector: 1M-event backlog drained", "detector drain", "BrokerThroughput:drain_events/s")
	add("detector: live, producer on the same cores (end to end)", "detector live e2e", "BrokerThroughput:e2e_events/s")
	for _, k := range keysWith(vals, "Ledger/", ":events/s") {
		sc := strings.TrimSuffix(strings.TrimPrefix(k, "Ledger/"), ":events/s")
		add("quota ledger: "+sc, "ledger "+strings.SplitN(sc, "/", 2)[0], k)
	}
	return out
}

// summary is the curated part of a section: its key numbers and plots.
func summary(name string, rep *Report) string {
	vals := rep.values
	var b strings.Builder
	switch name {
	case "limiter":
		b.WriteString(rep.plotMarkdown("limiter-latency.svg", "limiter latency against offered load"))
		b.WriteString(rep.plotMarkdown("limiter-throughput.svg", "limiter achieved against offered load"))
		b.WriteString(rep.plotMarkdown("limiter-engine.svg", "in-process engine checks/s"))
		b.WriteString("\n")
		cases, byBatch := engineCases(vals)
		if len(cases) > 0 {
			b.WriteString("| engine case (`BenchmarkEngineCheck`) | batch=1 checks/s | batch=64 checks/s |\n|---|---|---|\n")
			for i, c := range cases {
				fmt.Fprintf(&b, "| %s | %s | %s |\n", c, cellRate(byBatch["batch=1"], i), cellRate(byBatch["batch=64"], i))
			}
			if v, ok := vals["EnvoyShouldRateLimit:checks/s"]; ok {
				fmt.Fprintf(&b, "| Envoy `ShouldRateLimit` over gRPC on loopback (one bucket) | %s | |\n", v)
			}
			b.WriteString("\n")
		}
	case "pipeline":
		b.WriteString(rep.plotMarkdown("pipeline-throughput.svg", "pipeline throughput"))
		b.WriteString(rep.plotMarkdown("pipeline-lag.svg", "pipeline lag"))
		b.WriteString("\n| stage | throughput |\n|---|---|\n")
		for _, s := range pipelineStages(vals) {
			fmt.Fprintf(&b, "| %s | %s |\n", s.name, fmtValue(s.rate, "/s"))
		}
		b.WriteString("\n| lag | value |\n|---|---|\n")
		fmt.Fprintf(&b, "| detector, live: max lag | %s events (%s of production) |\n",
			fmtValue(get(vals, "BrokerThroughput:max_lag_events"), ""), fmtValue(get(vals, "BrokerThroughput:max_lag_s"), "s"))
		for _, k := range keysWith(vals, "Ledger/", ":lag-p99-s") {
			n := strings.TrimSuffix(k, ":lag-p99-s")
			fmt.Fprintf(&b, "| quota ledger, %s: p50 / p99 / highest bucket (≤, histogram bounds) | %s / %s / %s |\n", strings.TrimPrefix(n, "Ledger/"),
				fmtValue(get(vals, n+":lag-p50-s"), "s"), fmtValue(get(vals, n+":lag-p99-s"), "s"), fmtValue(get(vals, n+":lag-max-bucket-s"), "s"))
		}
		b.WriteString("\n")
	case "detector":
		b.WriteString(rep.plotMarkdown("detector-quality.svg", "detection quality"))
		b.WriteString(rep.plotMarkdown("detector-quality-latency.svg", "detection latency per abusive family"))
		b.WriteString(rep.plotMarkdown("detector-latency.svg", "detection latency"))
		b.WriteString("\n| what | measured |\n|---|---|\n")
		for _, n := range qualityInstances(vals) {
			k := "quality." + strconv.Itoa(n) + ":"
			fmt.Fprintf(&b, "| held-out traffic, %d detector instance(s): abusive penalized (recall) | %s of %s |\n", n,
				fmtValue(100*get(vals, k+"recall"), "%"), fmtValue(get(vals, k+"abusive"), ""))
			fmt.Fprintf(&b, "| held-out traffic, %d detector instance(s): legitimate principals penalized | %s of %s (%s) |\n", n,
				fmtValue(get(vals, k+"legit_penalized"), ""), fmtValue(get(vals, k+"legitimate"), ""), fmtValue(get(vals, k+"false_positive_rate"), "%"))
			fmt.Fprintf(&b, "| held-out traffic, %d detector instance(s): latency from abuse start p50 / p99, rate (rapid_fire); breadth (distributed_ip incl. fan-out) | %s / %s; %s / %s |\n", n,
				fmtValue(get(vals, k+"rate_p50_ms"), "ms"), fmtValue(get(vals, k+"rate_p99_ms"), "ms"), fmtValue(get(vals, k+"fanout_p50_ms"), "ms"), fmtValue(get(vals, k+"fanout_p99_ms"), "ms"))
		}
		if v, ok := vals["quality:agree"]; ok {
			fmt.Fprintf(&b, "| held-out traffic: same detections from 1 and 3 instances | %s |\n", map[bool]string{true: "yes", false: "**no**"}[v.V == 1])
		}
		fmt.Fprintf(&b, "| abusive principals penalized within the run (recall) | %s of %s |\n",
			fmtValue(100*get(vals, "BrokerLatency:recall"), "%"), fmtValue(get(vals, "BrokerLatency:abusive"), ""))
		fmt.Fprintf(&b, "| legitimate principals penalized (false positives) | %s of %s (%s) |\n", fmtValue(get(vals, "BrokerLatency:false_positives"), ""),
			fmtValue(get(vals, "BrokerLatency:legitimate"), ""), fmtValue(get(vals, "BrokerLatency:false_positive_rate"), "%"))
		fmt.Fprintf(&b, "| detection latency p50 / p99 | %s / %s |\n", fmtValue(get(vals, "BrokerLatency:p50_ms"), "ms"), fmtValue(get(vals, "BrokerLatency:p99_ms"), "ms"))
		fmt.Fprintf(&b, "| decode + score, one core | %s |\n", fmtValue(get(vals, "DecodeAndScore:events/s"), "/s"))
		b.WriteString(harmMarkdown(stepOf(rep.Sections, "detector-quality")))
		fmt.Fprintf(&b, "| score only, one core | %s |\n", fmtValue(get(vals, "ScoreOnly:events/s"), "/s"))
		for _, k := range keysWith(vals, "MemoryPerPrincipal/", ":bytes/principal") {
			fmt.Fprintf(&b, "| state per active principal, 1M principals, %s | %s |\n",
				strings.TrimSuffix(strings.TrimPrefix(k, "MemoryPerPrincipal/"), ":bytes/principal"), vals[k])
		}
		b.WriteString("\n")
	case "ledger":
		b.WriteString(rep.plotMarkdown("ledger-writes.svg", "ledger writes per million events"))
		b.WriteString("\n| scenario | events/s through the ledger | DynamoDB writes per 1M events | lag p50 / p99 (≤, histogram bounds) |\n|---|---|---|---|\n")
		for _, k := range keysWith(vals, "Ledger/", ":writes/1M-events") {
			n := strings.TrimSuffix(k, ":writes/1M-events")
			fmt.Fprintf(&b, "| %s | %s | %s | %s / %s |\n", strings.TrimPrefix(n, "Ledger/"), fmtValue(get(vals, n+":events/s"), "/s"),
				fmtValue(vals[k].V, ""), fmtValue(get(vals, n+":lag-p50-s"), "s"), fmtValue(get(vals, n+":lag-p99-s"), "s"))
		}
		b.WriteString("\n")
	}
	return b.String()
}

func cellRate(vs []float64, i int) string {
	if i >= len(vs) || math.IsNaN(vs[i]) {
		return ""
	}
	return thousands(vs[i])
}

// targetsMarkdown compares the measured values with the targets.
func (rep *Report) targetsMarkdown() string {
	vals := rep.values
	var b strings.Builder
	b.WriteString("| target | measured in this report | met? |\n|---|---|---|\n")
	row := func(target, measured string, ok, known bool) {
		verdict := "not measured"
		switch {
		case known && ok:
			verdict = "**yes**"
		case known:
			verdict = "**no**"
		}
		fmt.Fprintf(&b, "| %s | %s | %s |\n", target, measured, verdict)
	}
	if v, ok := vals["http@10000.p99"]; ok {
		row("limiter p99 ≤ 2 ms at 10k checks/s (HTTP)", fmt.Sprintf("p99 %s at 10,000/s offered (%s achieved, %s errors)", v,
			vals["http@10000.achieved"], vals["http@10000.errors"]), v.V <= targetP99At10kMs && vals["http@10000.errors"].V == 0, true)
	} else {
		row("limiter p99 ≤ 2 ms at 10k checks/s (HTTP)", "no 10,000/s run in `-rates`", false, false)
	}
	if v, ok := vals["http.saturation.achieved"]; ok {
		row("limiter ≥ 40k checks/s sustained (HTTP)", fmt.Sprintf("%s at saturation (p99 %s)", v, vals["http.saturation.p99"]), v.V >= targetChecksPerS, true)
	} else {
		row("limiter ≥ 40k checks/s sustained (HTTP)", "", false, false)
	}
	batchTarget := fmt.Sprintf("limiter ≥ 40k checks/s sustained (HTTP batch endpoint, %d checks per request)", batchChecks)
	if v, ok := vals["httpbatch.saturation.achieved"]; ok {
		row(batchTarget, fmt.Sprintf("%s at saturation (p99 %s per request)", v, vals["httpbatch.saturation.p99"]), v.V >= targetChecksPerS, true)
	} else {
		row(batchTarget, "", false, false)
	}
	if r := stepOf(rep.Sections, "limiter-peer"); r != nil && r.Peer != nil && len(r.Peer.Comparisons) > 0 {
		for _, c := range r.Peer.Comparisons {
			measured := fmt.Sprintf("%.2f×", c.Ratio)
			if len(c.Services) == 2 {
				measured += fmt.Sprintf(" (%s vs %s calls/s)", thousands(c.Services[1].CallsPerSec), thousands(c.Services[0].CallsPerSec))
			}
			if r.Peer.Placement == "" { // an unpinned run: issue 15's calls/s target
				row(fmt.Sprintf("limiter ≥ %g× envoy ratelimit over %s (same run, Redis and rule)", targetPeerRatio, c.Protocol), measured, c.Ratio >= targetPeerRatio, true)
			} else {
				target := targetPeerCoreGRPC
				if c.Protocol == "http" {
					target = targetPeerCoreHTTP
				}
				valid := len(c.Services) >= 2 && !c.Services[0].AllInvalid && !c.Services[1].AllInvalid
				m := fmt.Sprintf("%.2f× (%.1f vs %.1f µs service CPU per call)", c.ServiceCPURatio, c.Services[1].CPU.Service, c.Services[0].CPU.Service)
				if !valid {
					m += ", every round INVALID (generator's cores over 90 % busy)"
				}
				row(fmt.Sprintf("limiter ≥ %g× envoy ratelimit per service core-second over %s (pinned, same run)", target, c.Protocol), m, valid && c.ServiceCPURatio >= target, true)
				if c.FloorCPURatio > 0 && len(c.Services) > 2 {
					f := 1 / c.FloorCPURatio
					row(fmt.Sprintf("limiter within %g× of the do-nothing %s floor's CPU per call (pinned, same run)", targetFloorFactor, c.Protocol),
						fmt.Sprintf("%.2f× (%.1f vs %.1f µs)", f, c.Services[1].CPU.Service, c.Services[2].CPU.Service), valid && f <= targetFloorFactor, true)
				}
			}
			for _, o := range c.Open {
				if o.Name != "floodgate" || o.Offered != 10000 {
					continue
				}
				measured := fmt.Sprintf("p99 %.2f ms at 10,000/s offered (%s/s achieved, %d errors)", o.P99Ms, thousands(o.Achieved), o.Errors)
				if len(c.Open) >= 2 {
					measured += fmt.Sprintf("; envoy ratelimit p99 %.2f ms", c.Open[0].P99Ms)
				}
				row(fmt.Sprintf("limiter p99 ≤ %g ms at 10k checks/s (%s, beside envoy ratelimit)", targetP99At10kMs, c.Protocol), measured,
					o.P99Ms <= targetP99At10kMs && o.Errors == 0, true)
			}
		}
		if ev := r.Peer.Events; ev != nil {
			row("every decision event delivered beside envoy ratelimit (0 dropped, checked in the run)",
				fmt.Sprintf("%s calls answered; %s events sent, %.0f refused, %.0f failed, %.0f dropped by the journal",
					thousands(float64(ev.Calls)), thousands(ev.Sent), ev.Dropped, ev.Failed, ev.JournalDropped), ev.Delivered(), true)
		}
	} else {
		row(fmt.Sprintf("limiter ≥ %g× envoy ratelimit (same run, Redis and rule)", targetPeerRatio), "", false, false)
	}
	best, bestName := math.NaN(), ""
	for _, k := range keysWith(vals, "EngineCheck/", ":checks/s") {
		if strings.Contains(k, "over-limit-cache-hit") {
			continue // answered in-process without Redis
		}
		if v := vals[k].V; math.IsNaN(best) || v > best {
			best, bestName = v, strings.TrimSuffix(strings.TrimPrefix(k, "EngineCheck/"), ":checks/s")
		}
	}
	row("limiter ≥ 40k checks/s, in-process engine (through Redis)", ifKnown(best, fmt.Sprintf("best case %s: %s", bestName, fmtValue(best, "/s"))),
		best >= targetChecksPerS, !math.IsNaN(best))
	num := func(target, key, unit string, ok func(float64) bool) {
		v := get(vals, key)
		row(target, ifKnown(v, fmtValue(v, unit)), !math.IsNaN(v) && ok(v), !math.IsNaN(v))
	}
	num("detector ≥ 500k events/s per core, decode + score", "DecodeAndScore:events/s", "/s", func(v float64) bool { return v >= targetScorePerCore })
	num("detector ≥ 100k events/s end to end through the broker", "BrokerThroughput:e2e_events/s", "/s", func(v float64) bool { return v >= targetE2EEventsPerS })
	num("detection p99 ≤ 2 s (crossing event → penalty in Redis)", "BrokerLatency:p99_ms", "ms", func(v float64) bool { return v <= targetDetectP99Ms })
	num("≤ 300 bytes of state per active principal (3 routes each)", "MemoryPerPrincipal/routes=3:bytes/principal", "B", func(v float64) bool { return v <= targetBytesPerPrinc })
	if ns := qualityInstances(vals); len(ns) > 0 {
		// The held-out run: the worst pass counts.
		recall, fp, legit, worst := math.Inf(1), 0.0, 0.0, ""
		for _, n := range ns {
			k := "quality." + strconv.Itoa(n) + ":"
			recall = math.Min(recall, get(vals, k+"recall"))
			if v := get(vals, k+"legit_penalized"); v >= fp {
				fp, legit, worst = v, get(vals, k+"legitimate"), strconv.Itoa(n)
			}
		}
		row("≥ 99.5 % of abusive principals penalized (held-out traffic, worst of 1 and 3 instances)", ifKnown(recall, fmtValue(100*recall, "%")), recall >= targetRecall, !math.IsNaN(recall))
		row("≤ 0.001 % of legitimate principals penalized (held-out traffic, worst of 1 and 3 instances)",
			fmt.Sprintf("%s of %s (%s, %s instance(s))", fmtValue(fp, ""), fmtValue(legit, ""), fmtValue(100*fp/legit, "%"), worst), 100*fp/legit <= targetFalsePosPct, legit > 0)
		if v, ok := vals["quality:agree"]; ok {
			row("the same detections from 1 or N detector instances", map[bool]string{true: "same principals and patterns", false: "different"}[v.V == 1], v.V == 1, true)
		}
	} else {
		recall := get(vals, "BrokerLatency:recall")
		row("≥ 99.5 % of abusive principals penalized", ifKnown(recall, fmtValue(100*recall, "%")), recall >= targetRecall, !math.IsNaN(recall))
		fp, fpr := get(vals, "BrokerLatency:false_positives"), get(vals, "BrokerLatency:false_positive_rate")
		switch {
		case !math.IsNaN(fpr):
			row("≤ 0.001 % of legitimate principals penalized", fmt.Sprintf("%s of %s (%s)", fmtValue(fp, ""), fmtValue(get(vals, "BrokerLatency:legitimate"), ""), fmtValue(fpr, "%")),
				fpr <= targetFalsePosPct, true)
		case fp == 0:
			row("≤ 0.001 % of legitimate principals penalized", "0", true, true)
		default:
			row("≤ 0.001 % of legitimate principals penalized", ifKnown(fp, fmtValue(fp, "")+" (number of legitimate principals not in the log)"), false, false)
		}
	}
	if r := stepOf(rep.Sections, "quota-exactness"); r != nil {
		verdict := "TestFaultExactness passed"
		if r.Failed() {
			verdict = "TestFaultExactness failed"
		}
		row("quota: no lost or double-counted units across crashes, rebalances and replays", verdict, !r.Failed(), true)
	}
	return b.String()
}

func ifKnown(v float64, s string) string {
	if math.IsNaN(v) {
		return ""
	}
	return s
}

// harmMarkdown is the quality run's harm figure (loadtest/quality.Harm) as
// table rows: per family and pass, legitimate requests refused by a penalty
// and abusers' requests admitted after detection against their penalized
// allowance. Empty without a quality run.
func harmMarkdown(r *StepResult) string {
	if r == nil || r.Quality == nil {
		return ""
	}
	var b strings.Builder
	for _, res := range r.Quality.Results {
		for _, h := range res.Harm {
			if h.Abusive {
				fmt.Fprintf(&b, "| held-out traffic, %d detector instance(s), %s: requests admitted after detection (× the penalized allowance) | %s (%.2f×) |\n",
					res.Instances, h.Name, thousands(float64(h.AdmittedAfter)), h.AdmitRatio)
			} else {
				fmt.Fprintf(&b, "| held-out traffic, %d detector instance(s), %s: legitimate requests refused by a penalty | %s |\n",
					res.Instances, h.Name, thousands(float64(h.Refused)))
			}
		}
	}
	return b.String()
}
