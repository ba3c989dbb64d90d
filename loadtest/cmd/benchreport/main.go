// Command benchreport runs Floodgate's benchmark suite on the local stack —
// each benchmark a `go test -bench` subprocess, the limiter over HTTP with
// loadgen — and writes docs/benchmarks.md with the commands, the machine, the
// load average, result tables and SVG plots (docs/bench/*.svg).
//
//	go run ./loadtest/cmd/benchreport                      # everything, full size (make bench)
//	go run ./loadtest/cmd/benchreport -quick -out /tmp/b/benchmarks.md
//	go run ./loadtest/cmd/benchreport -only limiter,ledger
//
// A section whose command fails is reported as failed, with the tail of its
// output, and the command exits non-zero after writing the report.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cli"

	"github.com/floodgate-dev/floodgate/loadtest/benchreport"
)

func main() {
	cli.Main(nil, "benchreport", func(ctx context.Context) error { return run(ctx, os.Args[1:], os.Getenv) })
}

func run(ctx context.Context, args []string, getenv func(string) string) error {
	fs := flag.NewFlagSet("benchreport", flag.ContinueOnError)
	out := fs.String("out", "docs/benchmarks.md", "the Markdown report to write; plots and raw outputs go to bench/ beside it")
	only := fs.String("only", "", "comma-separated sections to run: "+strings.Join(benchreport.SectionNames, ",")+" (default: all)")
	quick := fs.Bool("quick", false, "short benchtimes and load runs (minutes, not tens of minutes): for development, not for numbers")
	rates := fs.String("rates", "1000,10000,30000", "loadgen open-loop offered rates, checks/s")
	duration := fs.Duration("duration", 10*time.Second, "length of each loadgen run (-quick: 2s unless set)")
	url := fs.String("url", "http://127.0.0.1:18080", "where loadgen's limiter listens")
	tmpl := fs.String("template", "", "a template to render instead of the embedded loadtest/benchreport/benchmarks.md.tmpl")
	verbose := fs.Bool("v", false, "copy every command's output to stderr")
	replot := fs.Bool("replot", false, "run nothing: redraw the plots beside -out from the raw outputs an earlier run left there (the Markdown is not rewritten)")
	if err := fs.Parse(args); err != nil {
		return err
	}
	set := map[string]bool{}
	fs.Visit(func(f *flag.Flag) { set[f.Name] = true })
	if *quick && !set["duration"] {
		*duration = 2 * time.Second
	}
	dir, err := os.Getwd()
	if err != nil {
		return err
	}
	plotDir := filepath.Join(filepath.Dir(*out), "bench")
	if err := os.MkdirAll(plotDir, 0o755); err != nil {
		return fmt.Errorf("-out: %w", err)
	}
	absPlots, err := filepath.Abs(plotDir)
	if err != nil {
		return err
	}
	binDir, err := os.MkdirTemp("", "benchreport-")
	if err != nil {
		return err
	}
	defer os.RemoveAll(binDir)
	dynamo := getenv("FLOODGATE_DYNAMODB_ENDPOINT")
	if dynamo == "" {
		dynamo = "http://127.0.0.1:8000" // the local stack's, as the Makefile sets it
	}
	o := benchreport.Options{Quick: *quick, Duration: *duration, URL: *url, BinDir: binDir, DataDir: relTo(dir, absPlots), DynamoEndpoint: dynamo}
	if *only != "" {
		o.Sections = strings.Split(*only, ",")
	}
	for _, s := range strings.Split(*rates, ",") {
		r, err := strconv.ParseFloat(strings.TrimSpace(s), 64)
		if err != nil {
			return fmt.Errorf("-rates: %q is not a number", s)
		}
		o.Rates = append(o.Rates, r)
	}
	if err := o.Validate(); err != nil {
		return err
	}
	text := ""
	if *tmpl != "" {
		b, err := os.ReadFile(*tmpl)
		if err != nil {
			return fmt.Errorf("-template: %w", err)
		}
		text = string(b)
	}

	command := "go run ./loadtest/cmd/benchreport"
	if len(args) > 0 {
		command += " " + strings.Join(args, " ")
	}
	r := &benchreport.Runner{Dir: dir, Env: append(os.Environ(), "FLOODGATE_DYNAMODB_ENDPOINT="+dynamo), Progress: os.Stderr, Verbose: *verbose}
	if *replot {
		rep := &benchreport.Report{Sections: r.Reload(benchreport.Suite(o), plotDir)}
		if err := rep.WriteCharts(plotDir); err != nil {
			return err
		}
		fmt.Fprintf(os.Stderr, "benchreport: redrew the plots in %s/ from its raw outputs\n", plotDir)
		return nil
	}
	rep := &benchreport.Report{Machine: benchreport.ReadMachine(ctx, dir), Command: command, Quick: *quick}
	started := time.Now()
	rep.Sections = benchreport.Run(ctx, r, benchreport.Suite(o), o.Selected)
	if err := rep.Write(*out, text); err != nil {
		return err
	}
	fmt.Fprintf(os.Stderr, "benchreport: wrote %s and %s/ in %s\n", *out, plotDir, time.Since(started).Round(time.Second))
	if ctx.Err() != nil {
		return fmt.Errorf("interrupted: %w", ctx.Err())
	}
	if rep.Failed() {
		var failed []string
		for _, s := range rep.Sections {
			if s.Ran && s.Failed() {
				failed = append(failed, s.Name)
			}
		}
		return errors.New("failed sections: " + strings.Join(failed, ", ") + " (see " + *out + ")")
	}
	return nil
}

// relTo returns path relative to dir when it lies under it: the commands
// shown in the report then name docs/bench/… instead of an absolute path.
func relTo(dir, path string) string {
	if rel, err := filepath.Rel(dir, path); err == nil && !strings.HasPrefix(rel, "..") {
		return rel
	}
	return path
}
