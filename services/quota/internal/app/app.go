// Package app wires the quota service: the ledger consumer, the usage API and
// the usage CLI.
package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"strings"
	"sync/atomic"
	"text/tabwriter"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"golang.org/x/sync/errgroup"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
)

const usageText = `usage:
  quota                               run the ledger consumer and the usage API
  quota usage <kind:id> [--days N]    print a principal's usage for the last N days (default 1: today)
`

// Run runs the subcommand in args (without the program name): none runs the
// service until ctx is done; "usage" prints a principal's ledger to stdout.
func Run(ctx context.Context, args []string, getenv config.Getenv, stdout io.Writer, log *slog.Logger) error {
	if len(args) == 0 {
		return Serve(ctx, getenv, log)
	}
	switch args[0] {
	case "usage":
		return Usage(ctx, args[1:], getenv, stdout)
	case "help", "-h", "--help":
		_, err := io.WriteString(stdout, usageText)
		return err
	default:
		return fmt.Errorf("unknown command %q\n%s", args[0], usageText)
	}
}

// Usage is the CLI: quota usage bot:abc --days 7.
func Usage(ctx context.Context, args []string, getenv config.Getenv, stdout io.Writer) error {
	fs := flag.NewFlagSet("usage", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	days := fs.Int("days", 1, "how many days, today included (1..400)")
	asJSON := fs.Bool("json", false, "print JSON")
	// The principal may come before or after the flags.
	var principal string
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		principal, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("usage: %w\n%s", err, usageText)
	}
	if principal == "" && fs.NArg() == 1 {
		principal = fs.Arg(0)
	} else if fs.NArg() > 0 {
		return fmt.Errorf("usage: unexpected arguments %q\n%s", fs.Args(), usageText)
	}
	kind, id, ok := strings.Cut(principal, ":")
	if !ok {
		return fmt.Errorf("usage: principal %q: want kind:id, e.g. bot:abc\n%s", principal, usageText)
	}
	cfg, err := ledger.ConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	db, err := dynamo.NewClient(ctx, cfg.Dynamo)
	if err != nil {
		return err
	}
	store := ledger.NewStore(db, cfg.Dynamo.TablePrefix+dynamo.TableQuotaLedger, cfg.RetentionDays, time.Now)
	rep, err := ledger.UsageReport(ctx, store, kind, id, *days, time.Now())
	if err != nil {
		return err
	}
	return PrintReport(stdout, rep, *asJSON)
}

// PrintReport writes rep as a table (or JSON).
func PrintReport(w io.Writer, rep ledger.Report, asJSON bool) error {
	if asJSON {
		return writeJSON(w, rep)
	}
	if _, err := fmt.Fprintf(w, "principal %s\n", rep.Principal); err != nil {
		return err
	}
	tw := tabwriter.NewWriter(w, 0, 4, 2, ' ', tabwriter.AlignRight)
	fmt.Fprintf(tw, "day\tunits\t\n")
	for _, d := range rep.Days {
		fmt.Fprintf(tw, "%s\t%d\t\n", d.Day, d.Units)
	}
	fmt.Fprintf(tw, "total\t%d\t\n", rep.Total)
	return tw.Flush()
}

// Serve runs the ledger consumer and the HTTP API until ctx is done, then
// drains: not ready, stop fetching, flush and commit, close clients.
func Serve(ctx context.Context, getenv config.Getenv, log *slog.Logger) error {
	cfg, err := ledger.ConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := ledger.NewMetrics(reg)

	rdb := redisx.NewClient(redisx.Options{Addrs: cfg.RedisAddrs, DialTimeout: time.Second})
	defer rdb.Close()
	pingCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = redisx.Ping(pingCtx, rdb)
	cancel()
	if err != nil {
		return err
	}
	db, err := dynamo.NewClient(ctx, cfg.Dynamo)
	if err != nil {
		return err
	}
	table := cfg.Dynamo.TablePrefix + dynamo.TableQuotaLedger
	store := ledger.NewStore(db, table, cfg.RetentionDays, time.Now)
	consumer, err := ledger.NewConsumer(cfg, store, ledger.NewReseeder(rdb, cfg.ReseedMargin, time.Now), log, reg, metrics, time.Now)
	if err != nil {
		return err
	}

	var ready atomic.Bool
	mux := http.NewServeMux()
	mux.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusOK) })
	mux.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		w.WriteHeader(http.StatusOK)
	})
	mux.Handle("GET /metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.Handle("GET /v1/usage/{kind}/{id}", ledger.UsageHandler(store, time.Now))
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	var g errgroup.Group
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	g.Go(func() error { return consumer.Run(runCtx) })
	g.Go(func() error {
		if err := httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	ready.Store(true)
	log.Info("quota running", "addr", ln.Addr().String(), "topic", cfg.DecisionsTopic, "group", cfg.Group,
		"table", table, "flush_interval", cfg.FlushInterval.String())

	<-ctx.Done()
	ready.Store(false)
	log.Info("quota draining")
	stopRun()
	shutCtx, cancelShut := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancelShut()
	_ = httpSrv.Shutdown(shutCtx)
	return g.Wait()
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
