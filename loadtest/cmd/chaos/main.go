// Command chaos runs Floodgate's fault scenarios (loadtest/chaos) against
// processes it starts itself and DynamoDB Local, prints a Markdown report and
// writes it into the results section of docs/chaos.md.
//
//	go run ./loadtest/cmd/chaos            # every scenario, full size (make chaos)
//	go run ./loadtest/cmd/chaos -quick     # the CI subset (< 90 s)
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"log/slog"
	"os"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cli"

	"github.com/floodgate-dev/floodgate/loadtest/chaos"
)

func main() {
	log := slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))
	cli.Main(log, "chaos", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv, log) })
}

const beginMark, endMark = "<!-- chaos:results:begin -->", "<!-- chaos:results:end -->"

func run(ctx context.Context, args []string, getenv func(string) string, log *slog.Logger) error {
	fs := flag.NewFlagSet("chaos", flag.ContinueOnError)
	quick := fs.Bool("quick", false, "run the CI subset at CI size")
	doc := fs.String("doc", "docs/chaos.md", "write the report between the result markers of this file (empty: do not write)")
	only := fs.String("only", "", "comma-separated scenario names to run (default: all)")
	keep := fs.Bool("keep", false, "keep the work directory (logs, data) after the run")
	grpcConns := fs.Int("overload-grpc-conns", 0, "overload-grpc: the open-loop phases' connections (0: 1024)")
	saturation := fs.Int("overload-saturation", 0, "overload scenarios: offer 1.3× and 2× of this many checks/s and judge against it, instead of the saturation they measure (0: measured)")
	repeat := fs.Int("overload-repeat", 1, "overload scenarios: run the 1.3× and 2× phases this many times in turn and report each phase's median and range")
	critLimiter := fs.Bool("overload-critical-limiter", false, "overload-grpc: serve the critical cluster from a limiter of its own, on the same core and in the same CPU quota")
	critQuota := fs.Float64("overload-critical-quota", 0, "overload-grpc with -overload-critical-limiter: the critical limiter's own CPU quota in cores (0: it shares the first limiter's)")
	quotaPeriod := fs.Duration("overload-quota-period", 0, "overload scenarios: the limiter's CPU quota period (0: 4ms; cgroup v1 takes 1ms..1s)")
	traceFor := fs.Duration("overload-trace", 0, "overload scenarios: take a runtime trace of the limiter this long from the middle of each open-loop phase and report its goroutines' waits for the CPU by how they were woken (it slows the limiter: a diagnosis, not a measurement)")
	perfHz := fs.Int("overload-perf", 0, "overload scenarios: sample the limiter with perf (linux-perf) this many times a second over each interleaved phase and report where a call's CPU went at each rate, by the rates' slices (a diagnosis; 0: off)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *critQuota != 0 && !*critLimiter {
		return errors.New("-overload-critical-quota needs -overload-critical-limiter")
	}
	size, command := chaos.Full, "go run ./loadtest/cmd/chaos"
	if *quick {
		size, command = chaos.Quick, command+" -quick"
	}
	size.Saturation = *saturation
	size.GRPCConns = *grpcConns
	size.OverloadRepeat = *repeat
	size.CriticalLimiter = *critLimiter
	size.QuotaPeriod = *quotaPeriod
	size.CriticalQuota = *critQuota
	size.Trace = *traceFor
	size.Perf = *perfHz
	e, err := chaos.NewEnv(ctx, chaos.Options{DynamoEndpoint: getenv("FLOODGATE_DYNAMODB_ENDPOINT"), KeepWorkDir: *keep, Logger: log})
	if err != nil {
		return err
	}
	defer e.Close()
	started := time.Now()
	results := chaos.RunAll(ctx, e, size, *quick, func(r chaos.Result) { fmt.Fprintln(os.Stderr, r.Line()) }, splitNames(*only)...)
	report := chaos.Markdown(results, command, started)
	fmt.Print(report)
	if *doc != "" && *only == "" {
		if err := writeDoc(*doc, report); err != nil {
			return err
		}
	}
	for _, r := range results {
		if !r.OK() {
			e.Keep()
			return fmt.Errorf("scenario %s failed (logs in %s)", r.Name, e.Dir)
		}
	}
	return nil
}

func splitNames(s string) []string {
	if s == "" {
		return nil
	}
	return strings.Split(s, ",")
}

// writeDoc replaces the text between the result markers of path.
func writeDoc(path, report string) error {
	b, err := os.ReadFile(path)
	if err != nil {
		return fmt.Errorf("read %s: %w", path, err)
	}
	s := string(b)
	i, j := strings.Index(s, beginMark), strings.Index(s, endMark)
	if i < 0 || j < i {
		return errors.New(path + ": no " + beginMark + " … " + endMark + " section")
	}
	s = s[:i+len(beginMark)] + "\n" + report + s[j:]
	if err := os.WriteFile(path, []byte(s), 0o644); err != nil {
		return fmt.Errorf("write %s: %w", path, err)
	}
	return nil
}
