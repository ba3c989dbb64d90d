// Command schedwait reads a Go runtime execution trace (a service's GET
// /debug/pprof/trace?seconds=N, or make chaos's -overload-trace) and prints
// how long its goroutines waited to run once runnable, by how they were
// woken and from where, the most waited first:
//
//	go run ./loadtest/cmd/schedwait [-top 20] limiter.trace
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cli"
	"github.com/floodgate-dev/floodgate/loadtest/internal/schedwait"
)

func main() {
	cli.Main(nil, "schedwait", func(context.Context) error { return run(os.Args[1:], os.Stdout) })
}

func run(args []string, out io.Writer) error {
	fs := flag.NewFlagSet("schedwait", flag.ContinueOnError)
	top := fs.Int("top", 20, "the classes (how woken, where) to print")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() != 1 {
		return errors.New("usage: schedwait [-top N] TRACE")
	}
	f, err := os.Open(fs.Arg(0))
	if err != nil {
		return err
	}
	defer f.Close()
	r, err := schedwait.Read(f)
	if err != nil {
		return err
	}
	fmt.Fprintf(out, "waits to run once runnable, %s\n\nby how woken:\n", r.Line())
	table := func(cs []schedwait.Class, n int) {
		fmt.Fprintf(out, "%8s %11s %9s %9s %9s  %s\n", "wakes", "waited", "p50", "p90", "p99", "how woken, where it had blocked")
		for i, c := range cs {
			if i == n {
				break
			}
			fmt.Fprintf(out, "%8d %9.1fms %7.2fms %7.2fms %7.2fms  %s %s\n", len(c.Waits), float64(c.Sum())/1e6,
				float64(c.Quantile(.5))/1e6, float64(c.Quantile(.9))/1e6, float64(c.Quantile(.99))/1e6, c.Kind, c.Where)
		}
	}
	table(r.ByKind(), -1)
	fmt.Fprintf(out, "\nthe trace had %s; by length:\n", r.GapLine())
	fmt.Fprintf(out, "%10s %8s\n", "ms", "stretches")
	for _, b := range schedwait.Histogram(r.Gaps.Waits, 2*time.Millisecond) {
		fmt.Fprintf(out, "%4.0f–%-4.0f %8d\n", float64(b.From)/1e6, float64(b.From+2*time.Millisecond)/1e6, b.N)
	}
	fmt.Fprintln(out, "\nby how woken and where:")
	table(r.Classes, *top)
	return nil
}
