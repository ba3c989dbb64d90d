// Package app wires the dead-letter auditor: `serve` (the default) consumes
// every *.dlq topic and serves the API; the other subcommands are the API's
// command-line client (see Usage).
package app

import (
	"context"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/PagerDuty/go-pagerduty"
	"github.com/google/uuid"
	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
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
  token          make an API token: -name N -role viewer|sre (prints the token and its FLOODGATE_DLQ_TOKENS entry)

The client commands call the API at FLOODGATE_DLQ_URL (default http://127.0.0.1:8084)
with the token in FLOODGATE_DLQ_TOKEN.
`

// Run runs the subcommand in env.Args (none: serve). Serve returns when ctx
// is done, after draining.
func Run(ctx context.Context, env service.Env) error {
	cmd, args := "serve", env.Args
	if len(args) > 0 {
		cmd, args = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return Serve(ctx, env, nil)
	case "help", "-h", "--help":
		_, err := io.WriteString(env.Stdout, Usage)
		return err
	default:
		return runClient(ctx, cmd, args, env.Getenv, env.Stdout)
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

// Serve runs the auditor until ctx is done. The API stops first (running
// replays and purges finish), then the DLQ consumers and the alerter.
func Serve(ctx context.Context, env service.Env, hooks *Hooks) error {
	if hooks == nil {
		hooks = &Hooks{}
	}
	log, reg := env.Log, env.Registry
	cfg, run, err := service.Start(env, auditor.ServiceConfigFromEnv, httpapi.DefaultServerConfig())
	if err != nil {
		return err
	}
	tokens, legacy, err := api.ParseTokens(cfg.Tokens.Reveal())
	if err != nil {
		return fmt.Errorf("config: FLOODGATE_DLQ_TOKENS (or its _FILE): %w", err)
	}
	if legacy {
		log.Warn("FLOODGATE_DLQ_TOKENS_FILE: the \"<name> <role> <sha256>\" lines are deprecated and will not be read after the next release; write token-spec entries, name:role:sha256hex (docs/configuration.md)")
	}
	if tokens.Len() == 0 {
		log.Warn("no API tokens: every API call will be refused; set FLOODGATE_DLQ_TOKENS or FLOODGATE_DLQ_TOKENS_FILE (see `dlq-auditor token`)")
	}

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
	run.Closer("influxdb", func() error { influx.Close(); return nil })
	points := influx.WriteAPI(cfg.InfluxOrg, cfg.InfluxBucket)
	run.Closer("influxdb points", func() error { points.Flush(); return nil })
	writeErrs := points.Errors()
	run.Tail("influxdb write errors", func(ctx context.Context) error {
		for {
			select {
			case err, ok := <-writeErrs:
				if !ok {
					return nil
				}
				log.Warn("influxdb write", "err", err)
			case <-ctx.Done():
				return nil
			}
		}
	})

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
		Sender: sender, Now: env.Now, Logger: log, Metrics: metrics,
	})
	ingester := &auditor.Ingester{Store: store, Points: points, Alerter: alerter, TTL: cfg.RecordTTL,
		Now: env.Now, Logger: log, Metrics: metrics}

	ksec, err := stream.Secure(ctx, cfg.KafkaBrokers, cfg.KafkaSecurity, 10*time.Second, log)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}
	transport := ksec.Transport()
	transport.MetadataTTL = time.Second
	kc := &kafka.Client{Addr: kafka.TCP(cfg.KafkaBrokers...), Timeout: 15 * time.Second, Transport: transport}
	newID := func() string { return uuid.NewString() }
	sup := &auditor.Supervisor{
		Client: kc, Interval: cfg.DiscoverInterval, Logger: log, Metrics: metrics,
		NewConsumer: func(topic string) (auditor.Runner, error) {
			cc := stream.ConsumerConfig{
				Brokers: cfg.KafkaBrokers, Security: ksec, Topic: topic, GroupID: stream.AuditGroup(cfg.Group, topic), Service: "dlq-auditor",
				// A record that cannot be stored is retried until it can (the
				// partition waits), never dropped. The handler never fails
				// permanently, so nothing goes to <topic>.dlq.dlq, which does
				// not exist: a panic would stall the partition, not lose data.
				MaxAttempts: 1 << 30,
				Logger:      log, Registerer: reg,
				// A dead letter keeps the original's traceparent: its process
				// span joins the trace of the message that failed.
				Tracing: env.Tracing,
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
			CanaryTimeout: cfg.CanaryTimeout, Now: env.Now, NewID: newID, Logger: log, Metrics: metrics, ReplayTopics: cfg.ReplayTopics},
		Purger:  &auditor.Purger{Store: store, Max: cfg.ReplayMax, Now: env.Now, NewID: newID, Metrics: metrics},
		Checker: &auditor.Checker{Store: store, Kafka: kc},
		Tokens:  tokens, Now: env.Now, Logger: log,
	})
	mux := httpapi.NewMux()
	srv.Register(mux)
	var addr net.Addr
	doc, err := openapi.JSON(openapi.DLQAuditor)
	if err == nil {
		addr, err = run.Serve(service.API{Name: "api", Addr: cfg.HTTPAddr, Handler: mux, Health: true,
			Metrics: "floodgate_dlq_auditor_api", AccessLog: true, OpenAPI: doc})
	}
	if err != nil {
		return err
	}
	// The consumers and the alerter stop once the API has drained: a replay
	// in flight still sees its canary dead-lettered again.
	run.Tail("dlq consumers", sup.Run)
	alertEvery := hooks.AlertInterval
	if alertEvery <= 0 {
		alertEvery = 10 * time.Second
	}
	run.Tail("alerter", func(ctx context.Context) error { return alerter.Run(ctx, alertEvery) })
	log.Info("dlq-auditor starting", "addr", addr.String(), "group", cfg.Group,
		"alert_threshold", cfg.AlertThreshold, "alert_window", cfg.AlertWindow.String(), "tokens", tokens.Len())
	if hooks.Listening != nil {
		hooks.Listening(addr.String())
	}
	return run.Run(ctx)
}
