// Package app wires the adjuster: signals from InfluxDB, the control loop,
// scales to Redis, adjustment events to Kafka, runtime settings and the audit
// log in DynamoDB, and the admin API; plus the simulate and token commands.
package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"net"
	"os"
	"path/filepath"
	"strings"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/admin"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/effects"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/loop"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/settings"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/signals"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/simulate"
)

const usage = `usage:
  adjuster                      run the control loop and the admin API
  adjuster simulate [flags]     replay a signal series through candidate rules and plot it
  adjuster token NAME ROLE      print a new API token and its FLOODGATE_ADJUSTER_TOKENS entry`

// Run dispatches on env.Args: none serves.
func Run(ctx context.Context, env service.Env) error {
	args, stdout := env.Args, env.Stdout
	if len(args) == 0 {
		return Serve(ctx, env)
	}
	switch args[0] {
	case "simulate":
		return Simulate(ctx, args[1:], env.Getenv, stdout)
	case "token":
		if len(args) != 3 || (args[2] != admin.RoleSRE && args[2] != admin.RoleViewer) {
			return fmt.Errorf("token: want NAME and ROLE (sre|viewer)\n%s", usage)
		}
		tok, err := admin.NewToken()
		if err != nil {
			return err
		}
		_, err = fmt.Fprintf(stdout, "token (give to %s, shown once): %s\nFLOODGATE_ADJUSTER_TOKENS entry: %s:%s:%s\n",
			args[1], tok, args[1], args[2], admin.HashToken(tok))
		return err
	case "-h", "--help", "help":
		_, err := fmt.Fprintln(stdout, usage)
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

// Serve runs the loop and the admin API until ctx is done.
func Serve(ctx context.Context, env service.Env) error {
	log, reg := env.Log, env.Registry
	cfg, run, err := service.Start(env, ConfigFromEnv, httpapi.DefaultServerConfig())
	if err != nil {
		return err
	}
	rdb, ksec, err := run.Connect(ctx, cfg.Backends)
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
	defer cancel()
	ddb, err := dynamo.NewClient(startCtx, dynamo.Options{Endpoint: cfg.DynamoEndpoint, TablePrefix: cfg.DynamoTablePrefix})
	if err != nil {
		_ = rdb.Close()
		return err
	}
	store := &settings.Dynamo{Client: ddb, RuntimeTable: cfg.DynamoTablePrefix + dynamo.TableRuntimeConfig,
		AuditTable: cfg.DynamoTablePrefix + dynamo.TableAuditLog}

	influx := influxdb2.NewClient(cfg.InfluxURL, cfg.InfluxToken)
	run.Closer("influxdb", func() error { influx.Close(); return nil })
	producer := stream.NewProducer(stream.ProducerConfig{Brokers: cfg.KafkaBrokers, Security: ksec, Topic: cfg.AdjustmentsTopic, Logger: log, Registerer: reg,
		Tracing: env.Tracing})
	run.Closer("kafka producer", producer.Close) // after the loop stopped: flushes its last adjustments

	src := &signals.Influx{Query: influx.QueryAPI(cfg.InfluxOrg), Bucket: cfg.InfluxBucket,
		Filters: cfg.Filters}
	lc := loop.Config{
		Source: src, Scales: &effects.RedisScales{Client: rdb, Key: cfg.ScalesKey}, Shed: &effects.RedisShed{Client: rdb, Key: cfg.ShedKey},
		Publisher: &effects.KafkaAdjustments{Producer: producer, Topic: cfg.AdjustmentsTopic, Source: "floodgate/adjuster"},
		Series:    &effects.InfluxSeries{Write: influx.WriteAPIBlocking(cfg.InfluxOrg, cfg.InfluxBucket)},
		Settings:  store, Defaults: cfg.Rules, ActorID: cfg.ActorID, Logger: log, Registerer: reg,
	}
	if cfg.PagerRoutingKey != "" {
		lc.Alerter = effects.NewPagerDuty(cfg.PagerRoutingKey, cfg.PagerURL)
	}
	l := loop.New(lc)
	if err := l.Start(startCtx); err != nil {
		_ = producer.Close()
		influx.Close()
		_ = rdb.Close()
		return fmt.Errorf("start loop: %w", err)
	}
	if cfg.Tokens.Len() == 0 {
		log.Warn("no admin API tokens configured (FLOODGATE_ADJUSTER_TOKENS): every admin call will be refused")
	}
	srv := admin.NewServer(admin.Config{Tokens: cfg.Tokens, Store: store, Loop: l, Defaults: cfg.Rules, Logger: log})
	var addr net.Addr
	doc, err := openapi.JSON(openapi.Adjuster)
	if err == nil {
		addr, err = run.Serve(service.API{Name: "admin", Addr: cfg.HTTPAddr, Handler: srv.Handler(), Health: true,
			Metrics: "floodgate_adjuster_admin", AccessLog: true, MaxBody: admin.MaxBody, OpenAPI: doc})
	}
	if err != nil {
		_ = producer.Close()
		influx.Close()
		_ = rdb.Close()
		return err
	}
	run.Worker("control loop", l.Run)
	if cfg.RulesTopic != "" {
		// The rule rollout controller: one writer per deployment, like the
		// loop, auditing to the same log (docs/rollouts.md).
		topic := rollout.NewTopic(cfg.KafkaBrokers, ksec, cfg.RulesTopic, log)
		run.Closer("rules topic producer", topic.Close)
		table := cfg.DynamoTablePrefix + dynamo.TableAuditLog
		op := &rollout.Operator{Topic: topic, Audit: &rollout.DynamoAudit{Client: ddb, Table: table}, Claims: &rollout.DynamoClaims{Client: ddb, Table: table},
			Validate: func(string, []byte) error { return errors.New("the controller publishes no new rules") }}
		ctl := rollout.NewController(op, rdb, "adjuster/rollout", log, reg)
		ctl.Window, ctl.Gate = cfg.RolloutWindow, cfg.RolloutGate
		run.Worker("rules rollout controller", ctl.Run)
	}
	if cfg.ParamsTopic != "" {
		// Detector parameters roll out the same way (docs/detector.md): the
		// detector instances count both versions' penalties in the same
		// hashes, so the same controller judges them.
		topic := rollout.NewTopic(cfg.KafkaBrokers, ksec, cfg.ParamsTopic, log)
		run.Closer("detector parameters topic producer", topic.Close)
		table := cfg.DynamoTablePrefix + dynamo.TableAuditLog
		op := &rollout.Operator{Topic: topic, Audit: &rollout.DynamoAudit{Client: ddb, Table: table, Subject: rollout.ParamsAuditSubject},
			Claims:   &rollout.DynamoClaims{Client: ddb, Table: table},
			Validate: func(string, []byte) error { return errors.New("the controller publishes no new parameters") }}
		ctl := rollout.NewController(op, rdb, "adjuster/params-rollout", log, reg)
		ctl.Window, ctl.Gate = cfg.RolloutWindow, cfg.RolloutGate
		// A candidate that stops penalizing what its parent catches gives
		// up detections: judged too (docs/detector.md).
		ctl.Gate.MaxLost, ctl.Gate.MinLost = cfg.ParamsMaxLost, cfg.ParamsMinLost
		run.Worker("detector parameters rollout controller", ctl.Run)
	}
	log.Info("adjuster starting", "addr", addr.String(), "scales_key", cfg.ScalesKey, "topic", cfg.AdjustmentsTopic, "rules_topic", cfg.RulesTopic,
		"tick", l.Settings().Rules.Tick.String(), "settings_version", l.Settings().Version)
	return run.Run(ctx)
}

// Simulate runs the simulate command.
func Simulate(ctx context.Context, args []string, getenv config.Getenv, stdout io.Writer) error {
	fs := flag.NewFlagSet("simulate", flag.ContinueOnError)
	fs.SetOutput(stdout)
	series := fs.String("series", "", "CSV series to replay (header "+strings.Join(simulate.CSVHeader, ",")+")")
	fromInflux := fs.Bool("from-influx", false, "record the series from InfluxDB (FLOODGATE_INFLUX_*) instead")
	start := fs.String("start", "", "with --from-influx: start time, RFC 3339 or a duration ago such as 2h")
	stop := fs.String("stop", "", "with --from-influx: stop time, RFC 3339 (default now)")
	rulesFile := fs.String("rules", "", "candidate rules YAML (default: the built-in rules)")
	out := fs.String("out", "", "plot file: .html (page with the change table) or .svg")
	save := fs.String("save", "", "also write the replayed series as CSV (useful with --from-influx)")
	title := fs.String("title", "", "plot title")
	if err := fs.Parse(args); err != nil {
		return err
	}
	rules := control.Defaults()
	if *rulesFile != "" {
		data, err := os.ReadFile(*rulesFile)
		if err != nil {
			return fmt.Errorf("read rules: %w", err)
		}
		if rules, err = control.ParseRules(data); err != nil {
			return fmt.Errorf("%s: %w", *rulesFile, err)
		}
	}
	ext := strings.ToLower(filepath.Ext(*out))
	if *out == "" || (ext != ".html" && ext != ".svg") {
		return fmt.Errorf("--out must name a .html or .svg file")
	}
	var rows []simulate.Row
	switch {
	case *series != "" && !*fromInflux:
		f, err := os.Open(*series)
		if err != nil {
			return fmt.Errorf("open series: %w", err)
		}
		rows, err = simulate.ReadCSV(f)
		f.Close()
		if err != nil {
			return fmt.Errorf("%s: %w", *series, err)
		}
	case *fromInflux && *series == "":
		e := config.NewEnv(getenv)
		now := time.Now().UTC()
		t0, err := parseWhen(*start, now)
		if err != nil {
			return fmt.Errorf("--start: %w", err)
		}
		t1 := now
		if *stop != "" {
			if t1, err = parseWhen(*stop, now); err != nil {
				return fmt.Errorf("--stop: %w", err)
			}
		}
		client := influxdb2.NewClient(e.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL), e.String("FLOODGATE_INFLUX_TOKEN", ""))
		defer client.Close()
		filters, err := signalFilters(e)
		if err != nil {
			return err
		}
		src := &signals.Influx{Query: client.QueryAPI(e.String("FLOODGATE_INFLUX_ORG", "")),
			Bucket:  e.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket),
			Filters: filters}
		if rows, err = simulate.FromSource(ctx, src, t0, t1, rules.Tick.D(), rules.Window.D()); err != nil {
			return err
		}
	default:
		return fmt.Errorf("give exactly one of --series FILE or --from-influx")
	}
	res, err := simulate.Run(rules, rows, nil)
	if err != nil {
		return err
	}
	if *save != "" {
		if err := writeFile(*save, func(w io.Writer) error { return simulate.WriteCSV(w, rows) }); err != nil {
			return err
		}
	}
	if *title == "" {
		*title = "Floodgate adjuster what-if"
		if *rulesFile != "" {
			*title += ": " + filepath.Base(*rulesFile)
		}
	}
	render := res.SVG
	if ext == ".html" {
		render = res.HTML
	}
	if err := writeFile(*out, func(w io.Writer) error { return render(w, *title) }); err != nil {
		return err
	}
	_, err = fmt.Fprintf(stdout, "%swrote %s\n", res.Summary(), *out)
	return err
}

func parseWhen(s string, now time.Time) (time.Time, error) {
	if s == "" {
		return time.Time{}, errors.New("required")
	}
	if d, err := time.ParseDuration(s); err == nil {
		return now.Add(-d), nil
	}
	t, err := time.Parse(time.RFC3339, s)
	if err != nil {
		return time.Time{}, fmt.Errorf("%q: want RFC 3339 or a duration ago such as 2h", s)
	}
	return t, nil
}

func writeFile(path string, write func(io.Writer) error) error {
	f, err := os.Create(path)
	if err != nil {
		return fmt.Errorf("create %s: %w", path, err)
	}
	if err := write(f); err != nil {
		f.Close()
		return fmt.Errorf("write %s: %w", path, err)
	}
	if err := f.Close(); err != nil {
		return fmt.Errorf("close %s: %w", path, err)
	}
	return nil
}
