package benchreport

import (
	"fmt"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// Options choose what the suite runs and for how long.
type Options struct {
	Quick          bool          // short benchtimes and loadgen runs: for development and tests
	Sections       []string      // names from SectionNames to run; empty: all
	Rates          []float64     // loadgen open-loop offered rates, checks/s
	Duration       time.Duration // each loadgen run
	URL            string        // where the limiter loadgen starts listens
	BinDir         string        // where the limiter binary is built
	DataDir        string        // where raw outputs and loadgen's JSON go (beside the plots)
	DynamoEndpoint string        // FLOODGATE_DYNAMODB_ENDPOINT for the benchmarks that use DynamoDB Local
}

// SectionNames are the sections of the report, in order.
var SectionNames = []string{"limiter", "pipeline", "detector", "ledger"}

// Section is one part of the report and the steps whose results it shows.
// Steps may be shared between sections; a shared step runs once.
type Section struct {
	Name, Title string
	Steps       []*Step
}

// Validate checks the options a caller set.
func (o Options) Validate() error {
	for _, s := range o.Sections {
		if !contains(SectionNames, s) {
			return fmt.Errorf("-only: unknown section %q (want some of %s)", s, strings.Join(SectionNames, ","))
		}
	}
	if len(o.Rates) == 0 {
		return fmt.Errorf("-rates: at least one offered rate")
	}
	for _, r := range o.Rates {
		if r <= 0 {
			return fmt.Errorf("-rates: %v is not a positive rate", r)
		}
	}
	if o.Duration <= 0 {
		return fmt.Errorf("-duration: %s is not positive", o.Duration)
	}
	if o.BinDir == "" || o.DataDir == "" {
		return fmt.Errorf("BinDir and DataDir are required")
	}
	return nil
}

func contains(list []string, s string) bool {
	for _, x := range list {
		if x == s {
			return true
		}
	}
	return false
}

// Selected reports whether section name is to run.
func (o Options) Selected(name string) bool {
	return len(o.Sections) == 0 || contains(o.Sections, name)
}

// goBench runs the benchmarks matching bench in pkg (one package, or several
// separated by spaces).
func goBench(id, title string, env []string, pkg, bench string, flags ...string) *Step {
	argv := append([]string{"go", "test", "-run", "^$", "-bench", bench, "-benchmem"}, flags...)
	return &Step{ID: id, Title: title, Kind: GoBench, Env: env, Commands: [][]string{append(argv, strings.Fields(pkg)...)}}
}

// Suite returns the sections of the benchmark suite with their commands.
func Suite(o Options) []Section {
	bt := func(full, quick string) []string {
		if o.Quick {
			return []string{"-benchtime", quick}
		}
		return []string{"-benchtime", full}
	}
	dynamo := []string{"FLOODGATE_DYNAMODB_ENDPOINT=" + o.DynamoEndpoint}
	heavy := []string{"-benchtime", "1x", "-timeout", "30m"}

	limiterBin := filepath.Join(o.BinDir, "limiter")
	rates := make([]string, len(o.Rates))
	for i, r := range o.Rates {
		rates[i] = strconv.FormatFloat(r, 'f', -1, 64)
	}
	httpJSON := filepath.Join(o.DataDir, "limiter-http.json")
	limiterHTTP := &Step{ID: "limiter-http", Title: "Limiter over HTTP: saturation and fixed offered loads", Kind: LoadGen, JSON: httpJSON,
		Commands: [][]string{
			{"go", "build", "-o", limiterBin, "./services/limiter"},
			{"go", "run", "./loadtest/cmd/loadgen", "-start", limiterBin, "-url", o.URL, "-rates", strings.Join(rates, ","),
				"-duration", o.Duration.String(), "-json", httpJSON},
		}}
	// The batch endpoint (POST /v1/check/batch) at the same offered checks/s: requests of batchChecks checks.
	batchRates := make([]string, len(o.Rates))
	for i, r := range o.Rates {
		batchRates[i] = strconv.FormatFloat(max(r/batchChecks, 1), 'f', -1, 64)
	}
	batchJSON := filepath.Join(o.DataDir, "limiter-http-batch.json")
	limiterBatch := &Step{ID: "limiter-http-batch", Title: fmt.Sprintf("Limiter over HTTP, batch endpoint: %d checks per request", batchChecks),
		Kind: LoadGen, JSON: batchJSON,
		Commands: [][]string{
			{"go", "build", "-o", limiterBin, "./services/limiter"},
			{"go", "run", "./loadtest/cmd/loadgen", "-start", limiterBin, "-url", o.URL, "-batch", strconv.Itoa(batchChecks),
				"-rates", strings.Join(batchRates, ","), "-workers", "32", "-saturation-workers", "8",
				"-duration", o.Duration.String(), "-json", batchJSON},
		}}
	// envoy ratelimit beside the limiter, one run, same Redis and rule,
	// alternating rounds; the closed-loop rounds with each service under a
	// 0.3-core quota and 256 callers, so that every service saturates its
	// quota before the generator fills its core (unquota'd, Floodgate's
	// rounds were generator-bound: docs/benchmarks.md, "Per core-second at
	// saturation"); the open-loop rounds at 8,000 calls/s, a rate envoy
	// ratelimit keeps up with pinned (at 10,000/s its rounds fell behind:
	// docs/benchmarks.md, equal load).
	peerJSON := filepath.Join(o.DataDir, "limiter-peer.json")
	quota := []string{"-quota", "0.3", "-callers", "256", "-rate", "8000"}
	pargs := append([]string{"-duration", "10s", "-rounds", "4"}, quota...)
	if o.Quick {
		pargs = append([]string{"-duration", "2s", "-rounds", "2"}, quota...)
	}
	peer := &Step{ID: "limiter-peer", Title: "Limiter beside envoy ratelimit over gRPC and HTTP (same run, Redis and rule)", Kind: Peer, JSON: peerJSON,
		Commands: [][]string{append(append([]string{"go", "run", "./loadtest/cmd/peerbench"}, pargs...), "-json", peerJSON)}}
	engine := goBench("limiter-engine", "In-process engine, Envoy RLS and response encoding", nil, "./pkg/limiter/", ".", bt("3s", "200ms")...)
	keys := goBench("limiter-keys", "Redis key building, one core", nil, "./pkg/redisx/", ".", append(bt("1s", "100ms"), "-cpu", "1")...)

	codec := goBench("events-codec", "Event codec, one core", nil, "./pkg/events/", ".", append(bt("1s", "100ms"), "-cpu", "1")...)
	stream := goBench("stream", "Kafka producer, consumer and journal loops (in-process broker)", nil, "./pkg/stream/ ./pkg/journal/", ".", bt("1s", "100ms")...)
	dlq := goBench("dlq-auditor", "DLQ auditor redaction", nil, "./services/dlq-auditor/internal/auditor/", ".", bt("1s", "100ms")...)
	drain := goBench("detector-throughput", "Detector through the broker: backlog drain and live traffic", dynamo,
		"./services/detector/internal/app/", "BrokerThroughput", heavy...)
	ledger := goBench("ledger", "Quota ledger: backlog and steady state", dynamo, "./services/quota/internal/ledger/", "BenchmarkLedger", heavy...)

	score := goBench("detector-score", "Decode and score, one core", nil, "./services/detector/internal/score/", "DecodeAndScore|ScoreOnly",
		append(bt("1s", "100ms"), "-cpu", "1", "-count", "5")...) // the report takes the median of the 5
	memory := goBench("detector-memory", "State per active principal (1M principals)", nil, "./services/detector/internal/score/", "MemoryPerPrincipal",
		"-benchtime", "1x")
	// Held-out labeled traffic through 1 and 3 detector processes.
	qualityJSON := filepath.Join(o.DataDir, "detector-quality.json")
	qargs := []string{"-instances", "1,3", "-legit", "100000", "-abusive", "400", "-duration", "3m"}
	if o.Quick {
		qargs = []string{"-instances", "1,3", "-legit", "2000", "-abusive", "40", "-duration", "2m"}
	}
	heldOut := &Step{ID: "detector-quality", Title: "Detection quality on held-out labeled traffic through the broker, 1 and 3 detector instances",
		Kind: Quality, JSON: qualityJSON,
		Commands: [][]string{append(append([]string{"go", "run", "./loadtest/cmd/quality"}, qargs...), "-json", qualityJSON)}}
	latency := goBench("detector-latency", "Detection quality and latency on labeled traffic through the broker", dynamo,
		"./services/detector/internal/app/", "BrokerLatency", heavy...)

	exact := []string{"go", "test", "-count", "1", "-run", "TestFaultExactness", "-timeout", "30m", "./services/quota/"}
	title := "Quota exactness under SIGKILLs, rebalances and replays (1M events)"
	if o.Quick {
		title = "Quota exactness under SIGKILLs, rebalances and replays (test size: 20k events)"
	} else {
		exact = append(exact, "-quota.big")
	}
	exactness := &Step{ID: "quota-exactness", Title: title, Kind: GoTest, Env: dynamo, Commands: [][]string{exact}}

	return []Section{
		{Name: "limiter", Title: "Limiter", Steps: []*Step{limiterHTTP, limiterBatch, peer, engine, keys}},
		{Name: "pipeline", Title: "Pipeline throughput and lag", Steps: []*Step{codec, stream, dlq, drain, ledger}},
		{Name: "detector", Title: "Detection quality and latency", Steps: []*Step{heldOut, latency, score, memory}},
		{Name: "ledger", Title: "Quota ledger writes", Steps: []*Step{ledger, exactness}},
	}
}
