package benchreport

import (
	"bytes"
	"context"
	"encoding/json"
	"encoding/xml"
	"errors"
	"io"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/bench"
	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
	"github.com/floodgate-dev/floodgate/loadtest/quality"
)

// testdata/*.txt are real outputs of the suite's commands (a -quick run of
// this generator, raw files from docs/bench/), named by step ID.

func readTestdata(t *testing.T, name string) []byte {
	t.Helper()
	b, err := os.ReadFile(filepath.Join("testdata", name))
	require.NoError(t, err)
	return b
}

func TestParseGoBench(t *testing.T) {
	for _, tc := range []struct {
		name, input string
		check       func(t *testing.T, o Output)
	}{
		{"real codec output, one core", string(readTestdata(t, "events-codec.txt")), func(t *testing.T, o Output) {
			b, ok := o.Find("BenchmarkDecodeDecision/floodgate")
			require.True(t, ok, "%+v", o.Benchmarks)
			require.Equal(t, 1, b.Procs)
			require.Equal(t, "github.com/floodgate-dev/floodgate/pkg/events", b.Pkg)
			require.Positive(t, b.Iters)
			for _, u := range []string{"ns/op", "MB/s", "events/s", "B/op", "allocs/op"} {
				v, ok := b.Get(u)
				require.True(t, ok, u)
				require.Positive(t, v, u)
			}
			require.Equal(t, "ns/op", b.Values[0].Unit, "units in the order printed, not benchfmt's tidied sec/op")
			require.Empty(t, o.Failures)
		}},
		{"real ledger output: sub-benchmarks, custom units, b.Log lines", string(readTestdata(t, "ledger.txt")), func(t *testing.T, o Output) {
			require.Len(t, o.Benchmarks, 2)
			b, ok := o.Find("BenchmarkLedger/steady/10k-per-s/500-principals")
			require.True(t, ok, "%+v", o.Benchmarks)
			require.Equal(t, 2, b.Procs)
			for _, u := range []string{"events/s", "writes/1M-events", "lag-p50-s", "lag-p99-s", "lag-max-bucket-s"} {
				_, ok := b.Get(u)
				require.True(t, ok, u)
			}
			require.NotEmpty(t, b.Log)
			require.Contains(t, b.Log[0], "UpdateItem calls")
		}},
		{"stderr between a result's name and its numbers", "pkg: example.com/x\n" +
			"BenchmarkBrokerLatency-2   \ttime=2026-01-01T00:00:00Z level=WARN msg=\"group rebalanced\"\n" +
			"time=2026-01-01T00:00:01Z level=WARN msg=again\n" +
			"       1\t62000000000 ns/op\t 0.98 recall\t 5.5 p99_ms\n" +
			"BenchmarkNext-2 \t 10\t 100 ns/op\n", func(t *testing.T, o Output) {
			require.Len(t, o.Benchmarks, 2)
			b := o.Benchmarks[0]
			require.Equal(t, "BenchmarkBrokerLatency", b.Name)
			require.Equal(t, 2, b.Procs)
			require.Equal(t, "example.com/x", b.Pkg)
			v, _ := b.Get("p99_ms")
			require.Equal(t, 5.5, v)
			v, _ = b.Get("recall")
			require.Equal(t, 0.98, v)
			require.Equal(t, "BenchmarkNext", o.Benchmarks[1].Name)
		}},
		{"a failing benchmark", "BenchmarkBroken-2   \t--- FAIL: BenchmarkBroken-2\n    x_test.go:12: no broker\nFAIL\nexit status 1\nFAIL\texample.com/x\t0.5s\n",
			func(t *testing.T, o Output) {
				require.Empty(t, o.Benchmarks)
				require.Contains(t, o.Failures, "--- FAIL: BenchmarkBroken-2")
				require.Contains(t, o.Failures, "FAIL\texample.com/x\t0.5s")
			}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			o, err := ParseGoBench(strings.NewReader(tc.input))
			require.NoError(t, err)
			tc.check(t, o)
		})
	}
}

func moduleRoot(t *testing.T) string {
	t.Helper()
	dir, err := filepath.Abs("../..")
	require.NoError(t, err)
	_, err = os.Stat(filepath.Join(dir, "go.mod"))
	require.NoError(t, err)
	return dir
}

// TestRunRealBenchmark runs a cheap benchmark of the suite as the report
// does, a `go test -bench` subprocess, and reads its results.
func TestRunRealBenchmark(t *testing.T) {
	r := &Runner{Dir: moduleRoot(t), Env: os.Environ()}
	step := goBench("events", "codec", nil, "./pkg/events/", "DecodeDecision", "-benchtime", "100x", "-cpu", "1")
	res := r.Run(context.Background(), step)
	require.NoError(t, res.Err, "%s", res.Output)
	b, ok := res.Bench.Find("BenchmarkDecodeDecision/floodgate")
	require.True(t, ok, "%s", res.Output)
	require.Equal(t, 100, b.Iters)
	v, ok := b.Get("events/s")
	require.True(t, ok)
	require.Positive(t, v)
	_, ok = res.Bench.Find("BenchmarkDecodeDecision/encoding_json")
	require.True(t, ok)
	require.GreaterOrEqual(t, res.LoadBefore, 0.0)
}

// fixtureReport is a report of every section built from testdata outputs of
// the real commands.
func fixtureReport(t *testing.T, o Options) *Report {
	t.Helper()
	var http, batch bench.Report
	require.NoError(t, json.Unmarshal(readTestdata(t, "limiter-http.json"), &http))
	require.NoError(t, json.Unmarshal(readTestdata(t, "limiter-http-batch.json"), &batch))
	start := time.Date(2026, 11, 22, 20, 0, 0, 0, time.UTC)
	rep := &Report{Machine: Machine{Date: start, Commit: "abc123", Dirty: true, CPU: "Test CPU", Cores: 2, MemoryGB: 24, Kernel: "linux", Go: "go1.26"},
		Command: "make bench"}
	done := map[*Step]*StepResult{}
	for _, s := range Suite(o) {
		sr := &SectionResult{Section: s, Ran: true, Started: start, LoadBefore: 1.5, LoadAfter: 2.5}
		for _, st := range s.Steps {
			res, ok := done[st]
			if !ok {
				res = &StepResult{Step: st, Started: start, LoadBefore: 1.5, LoadAfter: 2}
				switch st.Kind {
				case LoadGen:
					res.HTTP = &http
					if st.ID == "limiter-http-batch" {
						res.HTTP = &batch
					}
				case Quality:
					res.Quality = &quality.Summary{}
					require.NoError(t, json.Unmarshal(readTestdata(t, "detector-quality.json"), res.Quality))
				case Peer:
					res.Peer = &envoypeer.Report{}
					require.NoError(t, json.Unmarshal(readTestdata(t, "limiter-peer.json"), res.Peer))
				case GoBench:
					res.Output = readTestdata(t, st.ID+".txt")
					out, err := ParseGoBench(bytes.NewReader(res.Output))
					require.NoError(t, err, st.ID)
					require.NotEmpty(t, out.Benchmarks, st.ID)
					res.Bench = out
				}
				done[st] = res
			}
			sr.Steps = append(sr.Steps, res)
		}
		rep.Sections = append(rep.Sections, sr)
	}
	return rep
}

func testOptions(t *testing.T) Options {
	return Options{Rates: []float64{1000, 10000, 30000}, Duration: 10 * time.Second, URL: "http://127.0.0.1:18080",
		BinDir: "/tmp/bin", DataDir: "docs/bench", DynamoEndpoint: "http://127.0.0.1:8000"}
}

func TestReportHasEverySectionCommandTableAndPlot(t *testing.T) {
	o := testOptions(t)
	require.NoError(t, o.Validate())
	rep := fixtureReport(t, o)
	out := filepath.Join(t.TempDir(), "benchmarks.md")
	require.NoError(t, rep.Write(out, ""))
	require.False(t, rep.Failed())
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	md := string(b)

	for _, s := range Suite(o) {
		require.Contains(t, md, "## "+s.Title)
		for _, st := range s.Steps {
			require.Contains(t, md, "#### "+st.Title)
			for _, c := range st.CommandLines() {
				require.Contains(t, md, c)
			}
		}
	}
	for _, want := range []string{
		"`abc123` (dirty", "| CPU | 2 × Test CPU |",
		"| limiter ≥ 3× envoy ratelimit over grpc (same run, Redis and rule) | 1.56× (26,558 vs 17,029 calls/s) | **no** |",
		"| grpc | floodgate | 26,558 | 2.26 ms | 5.74 ms | 0 | 25 % |",
		"| limiter p99 ≤ 2 ms at 10k checks/s (grpc, beside envoy ratelimit) | p99 1.84 ms at 10,000/s offered (9,991/s achieved, 0 errors); envoy ratelimit p99 4.12 ms | **yes** |",
		"| grpc | envoy ratelimit | 10,000/s | 9,987/s | 0.91 ms | 4.12 ms | 9.80 ms | 0 |",
		"| every decision event delivered beside envoy ratelimit (0 dropped, checked in the run) | 312,140 calls answered; 312,140 events sent, 0 refused, 0 failed, 0 dropped by the journal | **yes** |", "- http: Floodgate / envoy ratelimit = **1.08×**", "limiter 1.50 → 2.50",
		"| run | offered checks/s | achieved checks/s |", "| open 100/s | 10,000 | 10,017 |",
		"| limiter ≥ 40k checks/s sustained (HTTP batch endpoint, 100 checks per request) | 38,295/s at saturation (p99 38.2 ms per request) |", "| engine case (`BenchmarkEngineCheck`) |", "| EngineCheck/one-tier/batch=64 | 2 |",
		"| Ledger/steady/10k-per-s/500-principals |", "| stage | throughput |", "| detection latency p50 / p99 |",
		"| limiter p99 ≤ 2 ms at 10k checks/s (HTTP) |", "| ≤ 0.001 % of legitimate principals penalized (held-out traffic, worst of 1 and 3 instances) | 607 of 100,000 (0.607 %, 3 instance(s)) | **no** |", "| the same detections from 1 or N detector instances | same principals and patterns | **yes** |", "Expected rapid_fire: 155 of 160 penalized",
		"FLOODGATE_DYNAMODB_ENDPOINT=http://127.0.0.1:8000 go test -run '^$' -bench BenchmarkLedger",
		"| family | expected | principals | 1 inst.: penalized | 1 inst.: latency p50 / p99 | 3 inst.: penalized |", "| bot_established | legitimate |",
		"| held-out traffic, 3 detector instance(s): legitimate principals penalized |", "| the same detections from 1 or N detector instances |",
		"go run ./loadtest/cmd/quality -instances 1,3 -legit 100000",
	} {
		require.Contains(t, md, want)
	}
	require.NotContains(t, md, "(not measured)", "a value the prose names is missing from the fixtures")
	require.NotContains(t, md, "_(no plot")

	series := map[string][]string{
		"limiter-latency.svg":          {"p50 (open loop)", "p99 (open loop)", "p99.9 (open loop)", "target: p99 ≤ 2 ms at 10k checks/s"},
		"limiter-throughput.svg":       {"achieved (open loop)", "target: ≥ 40,000 checks/s sustained", "saturation (closed loop)", "achieved, batch endpoint (100 checks/request)", "batch endpoint saturation"},
		"limiter-engine.svg":           {"batch=1", "batch=64", "one-tier", "Envoy ShouldRateLimit over gRPC"},
		"pipeline-throughput.svg":      {"detector drain", "ledger backlog", "producer"},
		"pipeline-lag.svg":             {"ledger steady: p50", "ledger steady: p99", "detector live: max"},
		"detector-latency.svg":         {"measured", "target: p99 ≤ 2,000 ms"},
		"detector-quality.svg":         {"abusive penalized (recall)", "legitimate left alone", "1 detector instance(s)", "3 detector instance(s)"},
		"detector-quality-latency.svg": {"cold_blast", "ato_fanout", "p50, 3 instance(s)", "p99, 3 instance(s)", "target: fan-out ≤ 10 s"},
		"ledger-writes.svg":            {"backlog/1M-events/1k-principals", "steady/10k-per-s/500-principals"},
	}
	for name, want := range series {
		t.Run(name, func(t *testing.T) {
			require.Contains(t, md, "](bench/"+name+")")
			svg, err := os.ReadFile(filepath.Join(filepath.Dir(out), "bench", name))
			require.NoError(t, err)
			texts := svgTexts(t, svg)
			for _, w := range want {
				require.True(t, containsText(texts, w), "%s has no %q in %q", name, w, texts)
			}
		})
	}
	raw, err := os.ReadFile(filepath.Join(filepath.Dir(out), "bench", "ledger.txt"))
	require.NoError(t, err)
	require.Equal(t, readTestdata(t, "ledger.txt"), raw)
}

// TestProseBetweenASectionsSummaryAndItsSteps: a template may split a
// section into its summary (sectionSummary) and its steps (sectionSteps) to
// keep hand-written prose beside the summary it speaks of; together they are
// the section, and a section left out with -only shows its prose after the
// "not run" line. The embedded template keeps the detector's decode + score
// history there.
func TestProseBetweenASectionsSummaryAndItsSteps(t *testing.T) {
	rep := fixtureReport(t, testOptions(t))
	whole, err := rep.Markdown(`{{section "detector"}}`)
	require.NoError(t, err)
	split, err := rep.Markdown(`{{sectionSummary "detector"}}PROSE{{sectionSteps "detector"}}`)
	require.NoError(t, err)
	require.Equal(t, whole, strings.Replace(split, "PROSE", "", 1))
	summaryAt, proseAt, stepAt := strings.Index(split, "| decode + score, one core |"), strings.Index(split, "PROSE"), strings.Index(split, "#### ")
	require.True(t, summaryAt >= 0 && summaryAt < proseAt && proseAt < stepAt, "summary %d, prose %d, first step %d", summaryAt, proseAt, stepAt)

	md, err := rep.Markdown("")
	require.NoError(t, err)
	summaryAt = strings.Index(md, "| decode + score, one core |")
	proseAt = strings.Index(md, "**Decode + score is now the median of 5 runs (2026-11-27).**")
	stepAt = strings.Index(md, "#### Detection quality on held-out labeled traffic")
	require.True(t, summaryAt >= 0 && summaryAt < proseAt && proseAt < stepAt, "summary %d, prose %d, first step %d", summaryAt, proseAt, stepAt)

	for _, s := range rep.Sections {
		s.Ran = s.Name != "detector"
	}
	notRun, err := rep.Markdown(`{{sectionSummary "detector"}}PROSE{{sectionSteps "detector"}}END`)
	require.NoError(t, err)
	require.Equal(t, "_Not run in this report (left out with `-only`)._\nPROSEEND", notRun)
}

// svgTexts parses an SVG as XML and returns its <text> contents.
func svgTexts(t *testing.T, svg []byte) []string {
	t.Helper()
	d := xml.NewDecoder(bytes.NewReader(svg))
	var texts []string
	inText, root := false, ""
	for {
		tok, err := d.Token()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		switch el := tok.(type) {
		case xml.StartElement:
			if root == "" {
				root = el.Name.Local
			}
			inText = el.Name.Local == "text"
		case xml.CharData:
			if inText {
				texts = append(texts, string(el))
			}
		case xml.EndElement:
			inText = false
		}
	}
	require.Equal(t, "svg", root)
	return texts
}

func containsText(texts []string, s string) bool {
	for _, x := range texts {
		if strings.Contains(x, s) {
			return true
		}
	}
	return false
}

func TestTargetsVerdicts(t *testing.T) {
	for _, tc := range []struct {
		name string
		vals map[string]Val
		want []string
	}{
		{"met", map[string]Val{"http@10000.p99": {1.5, "ms"}, "http@10000.achieved": {10000, "/s"}, "http@10000.errors": {0, ""},
			"BrokerLatency:false_positives": {0, ""}, "BrokerLatency:legitimate": {21050, ""}, "BrokerLatency:false_positive_rate": {0, "%"}},
			[]string{"| limiter p99 ≤ 2 ms at 10k checks/s (HTTP) | p99 1.50 ms at 10,000/s offered (10,000/s achieved, 0 errors) | **yes** |",
				"| ≤ 0.001 % of legitimate principals penalized | 0 of 21,050 (0 %) | **yes** |"}},
		{"missed", map[string]Val{"http@10000.p99": {2.5, "ms"}, "http@10000.achieved": {9000, "/s"}, "http@10000.errors": {0, ""},
			"BrokerLatency:false_positives": {1, ""}, "BrokerLatency:legitimate": {21050, ""}, "BrokerLatency:false_positive_rate": {100.0 / 21050, "%"}},
			[]string{"| limiter p99 ≤ 2 ms at 10k checks/s (HTTP) | p99 2.50 ms at 10,000/s offered (9,000/s achieved, 0 errors) | **no** |",
				"| ≤ 0.001 % of legitimate principals penalized | 1 of 21,050 (0.00475 %) | **no** |"}},
		{"not measured", map[string]Val{}, []string{"| limiter p99 ≤ 2 ms at 10k checks/s (HTTP) | no 10,000/s run in `-rates` | not measured |"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			rep := &Report{values: tc.vals}
			md := rep.targetsMarkdown()
			for _, w := range tc.want {
				require.Contains(t, md, w)
			}
		})
	}
}

// TestFailedCommandIsReported runs a section whose command fails: the
// report says so with the command's output, and keeps the other sections.
func TestFailedCommandIsReported(t *testing.T) {
	r := &Runner{Dir: moduleRoot(t), Env: os.Environ()}
	good := goBench("events-codec", "Event codec", nil, "./pkg/events/", "DecodeAdjustment", "-benchtime", "10x")
	bad := goBench("broken", "A benchmark of a package that does not exist", nil, "./pkg/no-such-package/", ".")
	sections := []Section{{Name: "pipeline", Title: "Pipeline throughput and lag", Steps: []*Step{good}},
		{Name: "detector", Title: "Detection quality and latency", Steps: []*Step{bad}},
		{Name: "limiter", Title: "Limiter"}, {Name: "ledger", Title: "Quota ledger writes"}}
	rep := &Report{Command: "test"}
	rep.Sections = Run(context.Background(), r, sections, func(s string) bool { return s != "ledger" })
	require.True(t, rep.Failed())
	require.False(t, rep.Sections[0].Failed())
	require.True(t, rep.Sections[1].Failed())
	require.False(t, rep.Sections[3].Ran)

	out := filepath.Join(t.TempDir(), "benchmarks.md")
	require.NoError(t, rep.Write(out, ""))
	b, err := os.ReadFile(out)
	require.NoError(t, err)
	md := string(b)
	det := md[strings.Index(md, "## Detection quality and latency"):]
	det = det[:strings.Index(det, "## Quota ledger writes")]
	require.Contains(t, det, "**FAILED**: go test -run '^$' -bench . -benchmem ./pkg/no-such-package/: exit status 1")
	require.Contains(t, det, "no-such-package", "the tail of the command's output")
	require.Contains(t, md, "| DecodeAdjustment/floodgate |")
	require.Contains(t, md, "_Not run in this report (left out with `-only`)._")
}

// Reload reads back what a run left beside the report, and the plots drawn from
// it are the plots the run drew.
func TestReloadRedrawsThePlotsOfARun(t *testing.T) {
	o := testOptions(t)
	data := t.TempDir()
	o.DataDir = data
	for _, s := range Suite(o) {
		for _, st := range s.Steps {
			switch st.Kind {
			case GoBench:
				require.NoError(t, os.WriteFile(filepath.Join(data, st.ID+".txt"), readTestdata(t, st.ID+".txt"), 0o644))
			case LoadGen, Quality, Peer:
				require.NoError(t, os.WriteFile(filepath.Join(data, st.ID+".txt"), []byte("table\n"), 0o644))
				require.NoError(t, os.WriteFile(st.JSON, readTestdata(t, filepath.Base(st.JSON)), 0o644))
			case GoTest:
				require.NoError(t, os.WriteFile(filepath.Join(data, st.ID+".txt"), []byte("ok  \tgithub.com/floodgate-dev/floodgate/services/quota\t1.0s\n"), 0o644))
			}
		}
	}
	want := fixtureReport(t, o)
	want.Build()

	r := &Runner{Dir: t.TempDir()} // JSON paths are absolute here; the directory must not matter
	got := &Report{Sections: r.Reload(Suite(o), data)}
	for _, s := range got.Sections {
		for _, st := range s.Steps {
			require.NoError(t, st.Err, st.Step.ID)
		}
	}
	out := t.TempDir()
	require.NoError(t, got.WriteCharts(out))
	require.Equal(t, len(want.Charts()), len(got.Charts()))
	for name, b := range want.Charts() {
		drawn, err := os.ReadFile(filepath.Join(out, name))
		require.NoError(t, err, name)
		require.Equal(t, string(b), string(drawn), name)
	}

	// A failed test, or a missing output, is a failed step, not a pass.
	require.NoError(t, os.WriteFile(filepath.Join(data, "quota-exactness.txt"), []byte("--- FAIL: TestFaultExactness\nFAIL\n"), 0o644))
	require.NoError(t, os.Remove(filepath.Join(data, "stream.txt")))
	failed := map[string]bool{}
	for _, s := range r.Reload(Suite(o), data) {
		for _, st := range s.Steps {
			if st.Err != nil {
				failed[st.Step.ID] = true
			}
		}
	}
	require.Equal(t, map[string]bool{"quota-exactness": true, "stream": true}, failed)
}

// A benchmark repeated with -count counts by its median, not its last line.
func TestRepeatedBenchmarkCountsByItsMedian(t *testing.T) {
	out, err := ParseGoBench(strings.NewReader(`goos: linux
BenchmarkDecodeAndScore 	 100	      2000 ns/op	    500000 events/s
BenchmarkDecodeAndScore 	 100	      1600 ns/op	    625000 events/s
BenchmarkDecodeAndScore 	 100	      4000 ns/op	    250000 events/s
PASS
`))
	if err != nil {
		t.Fatal(err)
	}
	vals := map[string]Val{}
	extract(&StepResult{Step: &Step{ID: "detector-score", Kind: GoBench}, Bench: out}, vals)
	if got := get(vals, "DecodeAndScore:events/s"); got != 500000 {
		t.Errorf("events/s = %v, want the median 500000 of three runs", got)
	}
	if got := median([]float64{4, 1, 3, 2}); got != 2.5 {
		t.Errorf("median of an even count = %v, want 2.5", got)
	}
}
