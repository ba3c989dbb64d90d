// Package app wires the quota service: the ledger consumer, the usage API and
// the usage CLI.
package app

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
	"github.com/floodgate-dev/floodgate/services/quota/internal/usageapi"
)

const usageText = `usage:
  quota                               run the ledger consumer and the usage API
  quota usage <kind:id> [--days N]    print a principal's usage for the last N days (default 1: today)
`

// Run runs the subcommand in env.Args: none runs the service until ctx is
// done; "usage" prints a principal's ledger to stdout.
func Run(ctx context.Context, env service.Env) error {
	args := env.Args
	if len(args) == 0 {
		return Serve(ctx, env)
	}
	switch args[0] {
	case "usage":
		return Usage(ctx, args[1:], env.Getenv, env.Stdout)
	case "help", "-h", "--help":
		_, err := io.WriteString(env.Stdout, usageText)
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
func Serve(ctx context.Context, env service.Env) error {
	log, reg := env.Log, env.Registry
	cfg, run, err := service.Start(env, ledger.ConfigFromEnv, httpapi.DefaultServerConfig())
	if err != nil {
		return err
	}
	var tokens *httpapi.Tokens
	if cfg.Tokens != "" {
		if tokens, err = usageapi.ParseTokens(cfg.Tokens.Reveal()); err != nil {
			return fmt.Errorf("config: FLOODGATE_QUOTA_TOKENS: %w", err)
		}
	} else {
		log.Warn("FLOODGATE_QUOTA_TOKENS is not set: the usage API answers anyone who reaches it (loopback only)", "addr", cfg.HTTPAddr)
	}
	metrics := ledger.NewMetrics(reg)

	rdb, ksec, err := run.Connect(ctx, cfg.Backends)
	if err != nil {
		return err
	}
	cfg.Kafka = ksec
	db, err := dynamo.NewClient(ctx, cfg.Dynamo)
	if err != nil {
		_ = rdb.Close()
		return err
	}
	table := cfg.Dynamo.TablePrefix + dynamo.TableQuotaLedger
	store := ledger.NewStore(db, table, cfg.RetentionDays, env.Now)
	store.Bounds = cfg.DayBounds
	cfg.Tracing = env.Tracing
	consumer, err := ledger.NewConsumer(cfg, store, ledger.NewReseeder(rdb, cfg.ReseedMargin, env.Now), log, reg, metrics, env.Now)
	if err != nil {
		_ = rdb.Close()
		return err
	}

	mux := httpapi.NewMux()
	usageapi.Register(mux, store, tokens, env.Now, log)
	doc, err := openapi.JSON(openapi.Quota)
	if err != nil {
		_ = rdb.Close()
		return err
	}
	addr, err := run.Serve(service.API{Name: "usage api", Addr: cfg.HTTPAddr, Handler: mux, Health: true,
		Metrics: "floodgate_quota_api", AccessLog: true, OpenAPI: doc})
	if err != nil {
		_ = rdb.Close()
		return err
	}
	run.Worker("ledger consumer", consumer.Run) // stops fetching, flushes and commits before it returns
	log.Info("quota starting", "addr", addr.String(), "topic", cfg.DecisionsTopic, "group", cfg.Group,
		"table", table, "flush_interval", cfg.FlushInterval.String())
	return run.Run(ctx)
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}
