// Package app wires the dead-letter auditor: `serve` (the default) consumes
// every *.dlq topic and serves the API; the other subcommands are the API's
// command-line client (see Usage).
package app

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"sync/atomic"
	"time"

	"github.com/PagerDuty/go-pagerduty"
	"github.com/google/uuid"
	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/api"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/auditor"
)

// Usage lists the subcommands.
const Usage = `usage: dlq-auditor [command] [flags]

  serve          consume every *.dlq topic and serve the API (the default)
  list           list dead letters:   -topic T | -service S  [-class C] [-from T] [-to T] [-limit N] [-json]
  inspect ID     one dead letter, decoded, with its headers and audit trail
  replay ID...   replay to the source topic: -reason R [-canary N] [-rate R]
                 (or select with list's filters instead of ids)
  purge ID...    delete stored records (audited): -reason R
  completeness   produced vs processed vs dead-lettered: -topic T -group G [-from T] [-to T]
  token          make an API token: -name N -role viewer|sre (prints the token and its tokens-file line)

The client commands call the API at FLOODGATE_DLQ_URL (default http://127.0.0.1:8084)
with the token in FLOODGATE_DLQ_TOKEN.
`

// Run runs the subcommand in args (args[0] is the first argument, not the
// program name). Serve returns when ctx is done, after draining.
func Run(ctx context.Context, args []string, getenv config.Getenv, stdout io.Writer, log *slog.Logger) error {
	cmd := "serve"
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return Serve(ctx, getenv, log, nil)
	case "help", "-h", "--help":
		_, err := io.WriteString(stdout, Usage)
		return err
	default:
		return runClient(ctx, cmd, args, getenv, stdout)
	}
}

// Hooks let tests observe a running server. Nil fields are ignored.
type Hooks struct {
	// Listening receives the API's address once it serves.
	Listening func(addr string)
	// Sender replaces the PagerDuty client (tests use a local receiver
	// through FLOODGATE_PAGERDUTY_URL instead; this is for fault injection).
	Sender auditor.EventSender
	// Consumer adjusts each DLQ consumer's configuration (test timings).
	Consumer func(*stream.ConsumerConfig)
	// AlertInterval overrides how often the alerter evaluates (default 10s).
	AlertInterval time.Duration
}

// Serve runs the auditor until ctx is done.
func Serve(ctx context.Context, getenv config.Getenv, log *slog.Logger, hooks *Hooks) error {
	if hooks == nil {
		hooks = &Hooks{}
	}
	cfg, err := auditor.ServiceConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	tokens := &api.Tokens{}
	if cfg.TokensFile != "" {
		f, err := os.Open(cfg.TokensFile)
		if err != nil {
			return fmt.Errorf("config: FLOODGATE_DLQ_TOKENS_FILE: %w", err)
		}
		tokens, err = api.ParseTokens(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("config: FLOODGATE_DLQ_TOKENS_FILE %s: %w", cfg.TokensFile, err)
		}
	}
	if tokens.Len() == 0 {
		log.Warn("no API tokens: every API call will be refused; set FLOODGATE_DLQ_TOKENS_FILE (see `dlq-auditor token`)")
	}

	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	metrics := auditor.NewMetrics(reg)
	if _, err := stream.NewMetrics(reg); err != nil {
		return err
	}

	ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: cfg.DynamoEndpoint, TablePrefix: cfg.TablePrefix})
	if err != nil {
		return err
	}
	store := auditor.NewStore(ddb, cfg.TablePrefix)

	influx := influxdb2.NewClientWithOptions(cfg.InfluxURL, cfg.InfluxToken, influxdb2.DefaultOptions().SetBatchSize(500).SetFlushInterval(1000))
	defer influx.Close()
	points := influx.WriteAPI(cfg.InfluxOrg, cfg.InfluxBucket)
	go func() {
		for err := range points.Errors() {
			log.Warn("influxdb write", "err", err)
		}
	}()
	defer points.Flush()

	sender := hooks.Sender
	if sender == nil && cfg.PagerRoutingKey != "" {
		var opts []pagerduty.ClientOptions
		if cfg.PagerURL != "" {
			opts = append(opts, pagerduty.WithV2EventsAPIEndpoint(cfg.PagerURL))
		}
		sender = pagerduty.NewClient("", opts...)
	}
	if cfg.PagerRoutingKey == "" {
		log.Warn("paging disabled: FLOODGATE_PAGERDUTY_ROUTING_KEY is not set; dead-letter rate alerts are only logged")
	}
	alerter := auditor.NewAlerter(auditor.AlerterConfig{
		Threshold: cfg.AlertThreshold, Window: cfg.AlertWindow, RoutingKey: cfg.PagerRoutingKey,
		Sender: sender, Now: time.Now, Logger: log, Metrics: metrics,
	})
	ingester := &auditor.Ingester{Store: store, Points: points, Alerter: alerter, TTL: cfg.RecordTTL,
		Now: time.Now, Logger: log, Metrics: metrics}

	kc := &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Timeout: 15 * time.Second,
		Transport: &kafka.Transport{MetadataTTL: time.Second}}
	newID := func() string { return uuid.NewString() }
	sup := &auditor.Supervisor{
		Client: kc, Interval: cfg.DiscoverInterval, Logger: log, Metrics: metrics,
		NewConsumer: func(topic string) (auditor.Runner, error) {
			cc := stream.ConsumerConfig{
				Brokers: cfg.KafkaBrokers, Topic: topic, GroupID: cfg.Group, Service: "dlq-auditor",
				// A record that cannot be stored is retried until it can (the
				// partition waits), never dropped. The handler never fails
				// permanently, so nothing goes to <topic>.dlq.dlq, which does
				// not exist: a panic would stall the partition, not lose data.
				MaxAttempts: 1 << 30,
				Logger:      log, Registerer: reg,
			}
			if hooks.Consumer != nil {
				hooks.Consumer(&cc)
			}
			return stream.NewConsumer(cc, ingester.Handle)
		},
	}
	srv := api.NewServer(api.Server{
		Store: store,
		Replayer: &auditor.Replayer{Store: store, Kafka: kc, Rate: cfg.ReplayRate, Max: cfg.ReplayMax,
			CanaryTimeout: cfg.CanaryTimeout, Now: time.Now, NewID: newID, Logger: log, Metrics: metrics, ReplayTopics: cfg.ReplayTopics},
		Purger:  &auditor.Purger{Store: store, Max: cfg.ReplayMax, Now: time.Now, NewID: newID, Metrics: metrics},
		Checker: &auditor.Checker{Store: store, Kafka: kc},
		Tokens:  tokens, Now: time.Now, NewID: newID, Logger: log,
	}, reg)

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
	srv.Register(mux)

	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}

	var g errgroup.Group
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	g.Go(func() error { return sup.Run(runCtx) })
	alertEvery := hooks.AlertInterval
	if alertEvery <= 0 {
		alertEvery = 10 * time.Second
	}
	g.Go(func() error { return alerter.Run(runCtx, alertEvery) })
	g.Go(func() error {
		if err := httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	ready.Store(true)
	log.Info("dlq-auditor running", "addr", ln.Addr().String(), "group", cfg.Group,
		"alert_threshold", cfg.AlertThreshold, "alert_window", cfg.AlertWindow.String(), "tokens", tokens.Len())
	if hooks.Listening != nil {
		hooks.Listening(ln.Addr().String())
	}

	<-ctx.Done()
	ready.Store(false)
	log.Info("dlq-auditor draining")
	shutCtx, cancelShut := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancelShut()
	_ = httpSrv.Shutdown(shutCtx) // finishes running replays and purges first
	stopRun()
	return g.Wait()
}
