// Command loadgen measures the limiter over HTTP: closed-loop saturation, then
// open-loop runs at fixed offered rates, printed as a Markdown table (and
// written as JSON with -json, for loadtest/cmd/benchreport).
//
//	loadgen -url http://127.0.0.1:8080 -rates 1000,10000,30000 -duration 10s
//	loadgen -start .local/bin/limiter ...   # start a limiter for the run (high limits, local Redis)
//	loadgen ... -json /tmp/loadgen.json     # also write the results as JSON
//	loadgen ... -batch 100 -rates 100,300   # POST /v1/check/batch, 100 checks per request
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"os"
	"os/exec"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cli"

	"github.com/floodgate-dev/floodgate/loadtest/bench"
)

func main() {
	cli.Main(nil, "loadgen", func(ctx context.Context) error { return run(ctx, os.Args[1:]) })
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("loadgen", flag.ContinueOnError)
	url := fs.String("url", "http://127.0.0.1:8080", "limiter base URL")
	start := fs.String("start", "", "path of a limiter binary to start for the run (on -url's port)")
	rates := fs.String("rates", "1000,10000,30000", "open-loop offered rates, checks/s")
	duration := fs.Duration("duration", 10*time.Second, "length of each run")
	workers := fs.Int("workers", 256, "concurrent requests in flight (and connections)")
	satWorkers := fs.Int("saturation-workers", 64, "senders for the closed-loop saturation run (0 skips it)")
	principals := fs.Int("principals", 10000, "distinct principals the checks are spread over")
	jsonOut := fs.String("json", "", "also write the results to this file as JSON (bench.Report)")
	batch := fs.Int("batch", 1, "checks per request: 1 sends POST /v1/check, more send POST /v1/check/batch (rates are then requests/s)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *batch < 1 || *batch > 100 {
		return fmt.Errorf("-batch: %d: must be in 1..100 (the limiter's MaxBatch)", *batch)
	}
	var offered []float64
	for _, s := range strings.Split(*rates, ",") {
		rate, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil || rate <= 0 {
			return fmt.Errorf("-rates: %q is not a positive number", s)
		}
		offered = append(offered, rate)
	}
	if *start != "" {
		stopLimiter, err := startLimiter(ctx, *start, strings.TrimPrefix(*url, "http://"))
		if err != nil {
			return err
		}
		defer stopLimiter()
	}
	if err := bench.WaitReady(ctx, *url+"/readyz", 20*time.Second); err != nil {
		return err
	}
	target := bench.NewTarget(*url, *principals, *workers, *batch)
	// Warm connections, the script cache and the buckets.
	target.ClosedLoop(ctx, time.Second, *satWorkers)

	var results []bench.Result
	if *satWorkers > 0 {
		results = append(results, target.ClosedLoop(ctx, *duration, *satWorkers))
	}
	for _, rate := range offered {
		results = append(results, target.OpenLoop(ctx, rate, *duration, *workers))
	}
	if err := ctx.Err(); err != nil {
		return fmt.Errorf("interrupted: %w", err)
	}
	host, _ := os.Hostname()
	fmt.Printf("limiter over HTTP, %s per run, %d principals, %d checks per request, %d in flight; machine %s: %d CPUs, %s; load generator, limiter and Redis on the same machine\n\n",
		*duration, *principals, *batch, *workers, host, runtime.NumCPU(), runtime.Version())
	fmt.Print(bench.Markdown(results))
	if *jsonOut != "" {
		rep := bench.Report{URL: *url, Duration: duration.Seconds(), Principals: *principals, Batch: *batch, Workers: *workers, SatWorkers: *satWorkers}
		for _, r := range results {
			rep.Runs = append(rep.Runs, r.Run())
		}
		b, err := json.MarshalIndent(rep, "", "  ")
		if err != nil {
			return fmt.Errorf("encode -json: %w", err)
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("write -json: %w", err)
		}
	}
	return nil
}

func startLimiter(ctx context.Context, path, addr string) (func(), error) {
	cmd := exec.Command(path)
	cmd.Env = append(os.Environ(),
		"FLOODGATE_LIMITER_ADDR="+addr,
		"FLOODGATE_GATEWAY=loadgen",
		"FLOODGATE_LIMITER_PRINCIPAL_LIMIT=1000000000", // measure the decision path, not denials
	)
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s: %w", path, err)
	}
	return func() {
		_ = cmd.Process.Signal(syscall.SIGTERM)
		_ = cmd.Wait()
	}, nil
}
