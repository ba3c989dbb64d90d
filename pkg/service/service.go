// Package service runs a Floodgate service: every main.go is
//
//	func main() { service.Main("adjuster", app.Run) }
//
// Main reads FLOODGATE_LOG_LEVEL, routes go-redis's log into the service's,
// sets the Go memory limit from the cgroup, turns SIGTERM/SIGINT into a
// cancelled context and hands the app an Env. The
// app's serve path builds its parts and hands them to a Runner, which owns
// the ready/live endpoints, the listeners and workers, the drain order and
// the shutdown deadline.
package service

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"regexp"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// Env is everything a service gets from its process.
type Env struct {
	Name     string   // the service, e.g. "adjuster"
	Args     []string // the arguments after the program name
	Getenv   config.Getenv
	Stdin    io.Reader
	Stdout   io.Writer
	Stderr   io.Writer
	Log      *slog.Logger
	Registry *prometheus.Registry // with the Go and process collectors
	Now      func() time.Time
	// Tracing is where the service's spans go: from the OTEL_* variables
	// under Exec, off (the zero value) from NewEnv.
	Tracing tracing.Tracing
}

// Func is every service's entry point: it runs the subcommand in env.Args
// (none: serve) until ctx is done.
type Func func(ctx context.Context, env Env) error

// Stdio is the process's side of an Env.
type Stdio struct {
	Args   []string
	Getenv config.Getenv
	Stdin  io.Reader
	Stdout io.Writer
	Stderr io.Writer
}

// Main runs run as the process and exits with its status: 0, 1 when run
// failed, 2 when the shared configuration (log level, OTEL_* tracing) is
// wrong.
func Main(name string, run Func) {
	os.Exit(Exec(context.Background(), name, run, Stdio{Args: os.Args[1:], Getenv: os.Getenv,
		Stdin: os.Stdin, Stdout: os.Stdout, Stderr: os.Stderr}))
}

// Exec is Main without the exit: it cancels ctx on SIGTERM or SIGINT (a
// second signal kills the process the default way) and returns the status.
// It builds the service's tracing from the OTEL_* variables (off unless they
// name an exporter or an endpoint) and, once run returned, flushes the spans
// still queued, for at most TracingFlushTimeout.
func Exec(ctx context.Context, name string, run Func, io Stdio) int {
	log, err := NewLogger(io.Getenv, io.Stderr)
	if err != nil {
		fmt.Fprintf(io.Stderr, "%s: %v\n", name, err)
		return 2
	}
	log = log.With("service", name)
	// go-redis's own lines (dial failures, Sentinel's news) in the service's
	// log, one per cause per 10 s. Process-wide: set once, here.
	redis.SetLogger(redisx.NewLogger(log, redisx.LogEvery, nil))
	env := NewEnv(name, io, log)
	tcfg, err := TracingConfigFromEnv(env.Getenv, name)
	if err != nil {
		log.Error("tracing configuration", "err", err)
		return 2
	}
	tr, shutdown, err := StartTracing(ctx, tcfg, env.Stdout)
	if err != nil {
		log.Error("start tracing", "err", err)
		return 1
	}
	if tr.Enabled() {
		// The SDK reports export failures through OTel's process-wide error
		// handler (else the standard logger): the process's own JSON log.
		otel.SetErrorHandler(otel.ErrorHandlerFunc(func(err error) { log.Warn("tracing", "err", err) }))
		log.Info("tracing on", "exporters", tcfg.Exporters, "protocol", tcfg.Protocol, "service_name", tcfg.ServiceName)
	}
	env.Tracing = tr
	defer func() {
		fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), TracingFlushTimeout)
		defer cancel()
		if err := shutdown(fctx); err != nil {
			log.Warn("flush spans", "err", err)
		}
	}()
	ctx, stop := signal.NotifyContext(ctx, os.Interrupt, syscall.SIGTERM)
	defer stop()
	config.SetMemoryLimit(ctx, log)
	go func() { <-ctx.Done(); stop() }() // from now on a second signal kills
	if err := run(ctx, env); err != nil {
		log.Error(name+" stopped", "err", err)
		return 1
	}
	return 0
}

// TracingFlushTimeout bounds flushing the last spans as the process ends.
const TracingFlushTimeout = 5 * time.Second

// RuntimeCollectors are the Go runtime's and the process's metrics every
// service serves, with the scheduler's — go_sched_latencies_seconds is how
// long goroutines waited for a CPU, what a budget lost on cores shared with
// other processes shows as — and the runtime's CPU classes
// (go_cpu_classes_gc_total_cpu_seconds_total and the rest): how much of the
// process's CPU the garbage collector took, which grows as the heap nears
// the memory limit.
func RuntimeCollectors() []prometheus.Collector {
	return []prometheus.Collector{
		collectors.NewGoCollector(collectors.WithGoCollectorRuntimeMetrics(collectors.MetricsScheduler, cpuClasses)),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
	}
}

// cpuClasses are the runtime's /cpu/classes/… metrics.
var cpuClasses = collectors.GoRuntimeMetricsRule{Matcher: regexp.MustCompile(`^/cpu/classes/.*`)}

// NewEnv builds an Env with a fresh registry (RuntimeCollectors) and the
// wall clock.
func NewEnv(name string, io Stdio, log *slog.Logger) Env {
	reg := prometheus.NewRegistry()
	reg.MustRegister(RuntimeCollectors()...)
	if io.Getenv == nil {
		io.Getenv = func(string) string { return "" }
	}
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return Env{Name: name, Args: io.Args, Getenv: io.Getenv, Stdin: io.Stdin, Stdout: io.Stdout, Stderr: io.Stderr,
		Log: log, Registry: reg, Now: time.Now}
}

// ParseLogLevel reads FLOODGATE_LOG_LEVEL: debug|info|warn|error (default info).
func ParseLogLevel(getenv config.Getenv) (slog.Level, error) {
	v := config.NewEnv(getenv).String("FLOODGATE_LOG_LEVEL", "info")
	switch v {
	case "debug":
		return slog.LevelDebug, nil
	case "info":
		return slog.LevelInfo, nil
	case "warn":
		return slog.LevelWarn, nil
	case "error":
		return slog.LevelError, nil
	}
	return 0, fmt.Errorf("FLOODGATE_LOG_LEVEL=%q: want debug, info, warn or error", v)
}

// NewLogger is the JSON logger every service writes to w (stderr), at
// FLOODGATE_LOG_LEVEL, adding the correlation id of a request's context.
func NewLogger(getenv config.Getenv, w io.Writer) (*slog.Logger, error) {
	level, err := ParseLogLevel(getenv)
	if err != nil {
		return nil, err
	}
	return slog.New(httpapi.LogHandler{Handler: slog.NewJSONHandler(w, &slog.HandlerOptions{Level: level})}), nil
}
