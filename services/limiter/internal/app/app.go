// Package app wires the limiter: Redis, the rules and their reloader, the
// decision engine, the decision-event producer, the InfluxDB counts and the HTTP
// API, with an orderly shutdown.
package app

import (
	"cmp"
	"context"
	_ "embed"
	"errors"
	"fmt"
	"log/slog"
	"math"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/embedded"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/limiter/influxcounts"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
)

// defaultRules is the grid served when FLOODGATE_LIMITER_RULES is unset.
//
//go:embed rate-limits.yaml
var defaultRules []byte

// defaultGCPercent replaces Go's GOGC=100 unless GOGC is set. The limiter's live
// heap is small (17.5 MB after a GC at saturation) and every check allocates, so
// at 100 it collected many times a second; at 400 a paired run gave 14–15k
// checks/s instead of ~9k, for a larger heap between collections (resident
// memory up to ~200 MB in a 10 s saturation run). docs/benchmarks.md.
const defaultGCPercent = 400

// defaultMemoryLimit is the Go soft memory limit when neither GOMEMLIMIT nor
// a cgroup memory limit gives one: GOGC=400 keeps its speed while the heap
// is small, and the collector works harder only as memory nears this.
const defaultMemoryLimit = 300 << 20

// setMemoryDefaults applies defaultGCPercent unless GOGC is set, and
// defaultMemoryLimit when no limit is in force: no GOMEMLIMIT and none from
// the cgroup (service.Main sets that one first). GOGC=400 alone let the heap
// grow to 5× live under overload: RSS 420–438 MiB at 2× saturation in make
// chaos overload, with a live heap of ~52 MB.
func setMemoryDefaults(getenv func(string) string, log *slog.Logger) {
	if getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	if getenv("GOMEMLIMIT") == "" && debug.SetMemoryLimit(-1) == math.MaxInt64 {
		debug.SetMemoryLimit(defaultMemoryLimit)
		log.Info("memory limit", "gomemlimit_bytes", int64(defaultMemoryLimit), "from", "the limiter's default (no GOMEMLIMIT, no cgroup limit)")
	}
}

// Run serves until ctx is done, then drains (pkg/service): not ready → stop
// accepting (HTTP, gRPC, proxy) → finish in-flight checks → flush queued
// decision events and counts → close clients.
func Run(ctx context.Context, env service.Env) error {
	if len(env.Args) > 0 && env.Args[0] != "serve" {
		return Command(ctx, env) // rules.go: validate, whatif, rollout, promote, rollback, status
	}
	setMemoryDefaults(env.Getenv, env.Log)
	log, reg := env.Log, env.Registry
	cfg, run, err := service.Start(env, ConfigFromEnv, ServerDefaults())
	if err != nil {
		return err
	}
	if cfg.Callers.Legacy() {
		log.Warn("FLOODGATE_LIMITER_CALLERS: entries without a role (name:sha256hex:…) are deprecated and will not be read after the next release; write name:gateway:sha256hex:… (docs/limiter.md)")
	}

	// Rules: a watched file, the single-bucket grid of FLOODGATE_LIMITER_PRINCIPAL_LIMIT, or the built-in grid.
	var rules *limiter.Ruleset
	var hup chan os.Signal
	switch {
	case cfg.RulesPath != "":
		hup = make(chan os.Signal, 1)
		signal.Notify(hup, syscall.SIGHUP)
		defer signal.Stop(hup)
	case cfg.PrincipalLimit > 0:
		rules = limiter.SinglePrincipalRules(cfg.PrincipalLimit, cfg.PrincipalPeriod)
	default:
		if rules, err = limiter.ParseRules("built-in rate-limits.yaml", defaultRules); err != nil {
			return err
		}
	}

	// The master in use, and every switch, in the limiter's own log and
	// metrics (issue 38); /readyz names it.
	redisOpts := redisx.Options{Addrs: cfg.RedisAddrs, SentinelMaster: cfg.SentinelMaster, SentinelAddrs: cfg.SentinelAddrs, DialTimeout: time.Second,
		ReadTimeout: cfg.RedisTimeout, WriteTimeout: cfg.RedisTimeout, Security: cfg.RedisSecurity,
		MinIdleConns: 8, // a shard's 4 pipelines in flight plus refunds, heartbeats and reloads: dialed ahead, not inside a check's budget
		Topology:     redisx.NewTopology(log, reg)}
	rdb := redisx.NewClient(redisOpts)
	run.Closer("redis", rdb.Close)
	redisFloor := redisx.NewRoundTripFloor(0) // the gRPC entry gate's target sits above it
	rdb.AddHook(redisFloor)
	reg.MustRegister(redisx.PoolCollector(rdb))
	fail := func(err error) error {
		_ = rdb.Close()
		return err
	}

	// The limiter never waits for Redis or Kafka to come up (it fails open or
	// closed per rule, and journals events), but credentials or certificates
	// they refuse are a configuration error: stop now, naming the variable.
	checkCtx, cancelCheck := context.WithTimeout(ctx, 5*time.Second)
	err = redisx.CheckAccess(checkCtx, rdb)
	cancelCheck()
	if err != nil {
		return fail(err)
	}
	ksec, err := stream.Secure(ctx, cfg.KafkaBrokers, cfg.KafkaSecurity, 5*time.Second, log)
	if err != nil {
		return fail(fmt.Errorf("kafka: %w", err))
	}

	var counts *influxcounts.ScopeCounts
	var observer server.Observer
	var rtt *limiter.RedisLatency
	if cfg.InfluxInterval > 0 {
		influx := influxdb2.NewClient(cfg.InfluxURL, cfg.InfluxToken)
		run.Closer("influxdb", func() error { influx.Close(); return nil })
		counts = influxcounts.NewScopeCounts(influx, cfg.InfluxOrg, cfg.InfluxBucket, cfg.Gateway, env.Now, log)
		observer = counts
		rtt = limiter.NewRedisLatency()
		counts.TrackRedis(rtt, cfg.RedisTimeout)
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	core, err := embedded.New(startCtx, embedded.Config{
		Redis: rdb, Rules: rules, RulesFile: cfg.RulesPath, RulesPoll: cfg.RulesPoll, Reload: hup, RulesTopic: cfg.RulesTopic,
		Brokers: cfg.KafkaBrokers, Kafka: ksec, Topic: cfg.DecisionsTopic, Journal: cfg.Journal, EventBuffer: cfg.EventBuffer,
		Gateway: cfg.Gateway, Observer: observer, RedisLatency: rtt,
		Budget: cfg.RedisTimeout, BreakerFailures: cfg.BreakerFailures, BreakerOpen: cfg.BreakerOpen,
		OverLimitEntries: cmp.Or(cfg.OverLimitCache, -1), RedisBatch: cfg.RedisBatch, Shadow: cfg.Shadow,
		RuntimePoll: cfg.RuntimePoll, Logger: log, Registry: reg, Callers: cfg.Callers, Tracing: env.Tracing,
	})
	cancel()
	if err != nil {
		if cfg.RulesPath != "" && errors.Is(err, embedded.ErrRulesFile) {
			return fail(fmt.Errorf("FLOODGATE_LIMITER_RULES: %w", err))
		}
		return fail(fmt.Errorf("start limiter: %w", err))
	}
	srv := core.Server()
	srv.SetReady(false) // ready once every listener is up
	srv.SetCheckTimeout(cfg.CheckTimeout)
	run.OnReady(srv.SetReady)
	// envoy ratelimit's configuration, served on the gRPC API beside Floodgate's own.
	var envoySrc *envoyconf.Source
	if cfg.EnvoyConfigDir != "" {
		if envoySrc, err = envoyconf.OpenDir(cfg.EnvoyConfigDir, envoyconf.Options{MergeDomains: cfg.EnvoyMerge}, log); err != nil {
			return fail(fmt.Errorf("FLOODGATE_LIMITER_ENVOY_CONFIG: %w", err))
		}
		envoyHup := make(chan os.Signal, 1)
		signal.Notify(envoyHup, syscall.SIGHUP)
		defer signal.Stop(envoyHup)
		run.Tail("envoy config reload", func(ctx context.Context) error { return envoySrc.Run(ctx, 2*time.Second, envoyHup) })
		log.Info("envoy ratelimit configuration loaded", "dir", cfg.EnvoyConfigDir, "domains", envoySrc.Config().Domains())
	}

	// Envoy's rate-limit service: on FLOODGATE_LIMITER_GRPC_ADDR below, and
	// on the check API's /json, as envoy ratelimit serves it.
	opts := []envoyrls.GRPCOption{envoyrls.WithMaxStreams(uint32(cfg.GRPCMaxStreams)), envoyrls.WithGate(cfg.GRPCGateMax, cfg.GRPCGateTarget, redisFloor.Floor), envoyrls.WithReadPacing(cfg.GRPCGatePace)}
	if envoySrc != nil {
		ec := &envoyrls.EnvoyConfig{Source: envoySrc,
			Evaluator: &envoyconf.Evaluator{Redis: rdb, Prefix: "fg:envoy:", GlobalShadow: cfg.EnvoyShadow, GlobalQuota: cfg.EnvoyQuota,
				EnvoyRatelimitKeys: cfg.EnvoyKeys == EnvoyKeysEnvoyRatelimit, EnvoyRatelimitPrefix: cfg.EnvoyKeyPrefix, StopIncrementOverLimit: cfg.EnvoyStopIncrement,
				ExpirationJitter: cfg.EnvoyExpirationJitter,
				Coalescer:        &redisx.Coalescer{Redis: rdb}, Algorithms: envoyrls.NewEnvoyAlgorithms(rdb)},
			Identity: cfg.EnvoyIdentity, FailureModeDeny: cfg.EnvoyFailureModeDeny, NearLimitRatio: cfg.EnvoyNearLimitRatio}
		if cfg.EnvoyLocalCache > 0 {
			ec.Evaluator.LocalCache = envoyconf.NewLocalCache(cfg.EnvoyLocalCache)
		}
		if cfg.EnvoyHeaders {
			ec.Headers = &envoyrls.EnvoyHeaders{Limit: cfg.EnvoyLimitHeader, Remaining: cfg.EnvoyRemainingHeader, Reset: cfg.EnvoyResetHeader}
		}
		opts = append(opts, envoyrls.WithEnvoyConfig(ec))
	}
	rls := envoyrls.NewEnvoyRLS(srv, opts...)
	srv.ServeEnvoyJSON(rls)

	// The check API: no access log and no request metrics on the hot path
	// (the engine counts decisions itself). FLOODGATE_LIMITER_IDLE_TIMEOUT and
	// _MAX_CONNS bound its connections (issue 22 S6).
	checkServer := run.Config().HTTP
	checkServer.IdleTimeout, checkServer.MaxConns, checkServer.MaxHeaderBytes = cfg.IdleTimeout, cfg.MaxConns, 16<<10
	doc, err := openapi.JSON(openapi.Limiter)
	if err != nil {
		return fail(err)
	}
	checkAPI := service.API{Name: "check api", Addr: cfg.HTTPAddr, Handler: srv.Handler(), Health: true,
		Readiness: http.HandlerFunc(srv.ServeReady), Server: &checkServer, OpenAPI: doc,
		Conns: httpapi.NewConnMetrics(reg, "floodgate_limiter_http", "Open connections of the check API (bounded by FLOODGATE_LIMITER_MAX_CONNS; more wait in the kernel's backlog).")}
	if cfg.HTTPServer == httpapi.TransportFastHTTP {
		checkAPI.Fast = srv.FastRoutes()
	}
	addr, err := run.Serve(checkAPI)
	if err != nil {
		return fail(err)
	}

	// Envoy's rate-limit service and gRPC health on FLOODGATE_LIMITER_GRPC_ADDR.
	grpcAddr := "off"
	if cfg.GRPCAddr != "off" {
		grpcLn, err := config.Listen(cfg.GRPCAddr) // host:port, or unix:PATH
		switch {
		case err != nil && cfg.GRPCAddrSet:
			return fail(fmt.Errorf("listen %s (FLOODGATE_LIMITER_GRPC_ADDR): %w", cfg.GRPCAddr, err))
		case err != nil: // the default port is taken (another limiter on this host): say so, serve HTTP
			log.Warn("envoy rate-limit service not started; set FLOODGATE_LIMITER_GRPC_ADDR", "addr", cfg.GRPCAddr, "err", err)
		default:
			grpcAddr = grpcLn.Addr().String()
			if _, unix := config.UnixSocket(cfg.GRPCAddr); unix {
				grpcAddr = cfg.GRPCAddr
			}
			grpcLn = httpapi.LimitListener(grpcLn, cfg.GRPCMaxConns, httpapi.NewConnMetrics(reg, "floodgate_limiter_grpc",
				"Open gRPC connections (bounded by FLOODGATE_LIMITER_GRPC_MAX_CONNS; more wait in the kernel's backlog)."))
			if cfg.GRPCTLS != nil {
				cfg.GRPCTLS.SetLogger(log)
				grpcLn = cfg.GRPCTLS.BoundedListener(grpcLn)
			}
			grpcSrv, hs, err := envoyrls.NewTransportServer(cfg.GRPCTransport, rls)
			if err != nil {
				return fail(fmt.Errorf("FLOODGATE_LIMITER_GRPC_TRANSPORT: %w", err))
			}
			run.OnReady(func(ready bool) {
				if ready {
					envoyrls.SetServing(hs, true)
				} else {
					hs.Shutdown() // every service NOT_SERVING
				}
			})
			run.Listener("envoy rls grpc", func() error { return grpcSrv.Serve(grpcLn) }, grpcSrv.Shutdown)
		}
	}
	// net/http/pprof on its own listener, off unless FLOODGATE_LIMITER_DEBUG_ADDR is set.
	if cfg.DebugAddr != "" {
		mux := httpapi.NewMux() // a path it does not serve is a 404 problem, as on every port
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		dc := run.Config().HTTP
		dc.WriteTimeout = 10 * time.Minute // a CPU profile or trace takes as long as asked
		if _, err := run.Serve(service.API{Name: "pprof (FLOODGATE_LIMITER_DEBUG_ADDR)", Addr: cfg.DebugAddr, Handler: mux, Server: &dc}); err != nil {
			return fail(err)
		}
	}
	if cfg.ProxyAddr != "" {
		dfr, err := newDeferrer(env, cfg, core, rdb, ksec, run)
		if err != nil {
			return fail(fmt.Errorf("deferral: %w", err))
		}
		if err := newProxy(cfg, srv, run, log, env.Tracing, dfr); err != nil {
			return fail(err)
		}
	}

	// The producer and the counts outlive the listeners so the last decisions still get out.
	run.Tail("decision events", core.Run)
	if counts != nil {
		run.Tail("influxdb counts", func(ctx context.Context) error { return counts.Run(ctx, cfg.InfluxInterval) })
	}
	log.Info("limiter serving", "addr", addr.String(), "grpc_addr", grpcAddr, "grpc_tls", cfg.GRPCTLS.Mode(), "grpc_transport", cfg.GRPCTransport, "debug_addr", cfg.DebugAddr, "redis", redisOpts, "kafka", cfg.KafkaBrokers,
		"topic", cfg.DecisionsTopic, "rules", core.Rules().Source, "rules_topic", cfg.RulesTopic, "rules_version", core.Rules().Version, "rule_count", len(core.Rules().Rules), "shadow", core.Rules().Shadow || cfg.Shadow)
	if !server.Publishing {
		log.Warn("built with -tags floodgate_noevents: no decision event is published (a benchmark build, never one to deploy)")
	}
	return run.Run(ctx)
}

// ServerDefaults are the limiter's HTTP limits unless FLOODGATE_HTTP_* says
// otherwise: a gateway fleet keeps many connections open to each limiter.
func ServerDefaults() httpapi.ServerConfig {
	sc := httpapi.DefaultServerConfig()
	sc.MaxConns = 16384
	sc.ReadTimeout, sc.WriteTimeout = 10*time.Second, 10*time.Second
	return sc
}

// newProxy builds the limiter's reverse-proxy mode: pkg/gateway's reverse proxy in
// front of the upstream, deciding in-process with the limiter's own engine. Bodies
// stream to and from the upstream, so only the header and idle timeouts and the
// connection limit apply, not the read and write timeouts.
func newProxy(cfg Config, srv *server.Server, run *service.Runner, log *slog.Logger, tr tracing.Tracing, dfr gateway.Deferrer) error {
	upstream, err := url.Parse(cfg.ProxyUpstream)
	if err != nil {
		return fmt.Errorf("FLOODGATE_LIMITER_PROXY_UPSTREAM: %w", err)
	}
	router, err := gateway.NewRouter(cfg.ProxyRoutes, "")
	if err != nil {
		return fmt.Errorf("FLOODGATE_LIMITER_PROXY_ROUTES: %w", err)
	}
	handler, err := gateway.NewReverseProxy(upstream, gateway.Options{
		Checker: embedded.FromServer(srv), Router: router, TrustedProxies: cfg.ProxyTrusted, Logger: log,
		Principal:           gateway.PrincipalFromHeaders(cfg.ProxyKindHeader, cfg.ProxyIDHeader, cfg.ProxyIdentityTrusted),
		PrincipalHeaders:    &gateway.PrincipalHeaders{Kind: cfg.ProxyKindHeader, ID: cfg.ProxyIDHeader},
		AnonymousIPv6Prefix: cfg.ProxyAnonIPv6Prefix,
		Timeout:             cfg.RedisTimeout * 4,
		Tracing:             tr,
		Deferrer:            dfr,
	})
	if err != nil {
		return err
	}
	sc := run.Config().HTTP
	sc.ReadTimeout, sc.WriteTimeout = 0, 0
	addr, err := run.Serve(service.API{Name: "reverse proxy (FLOODGATE_LIMITER_PROXY_ADDR)", Addr: cfg.ProxyAddr,
		Handler: handler, MaxBody: -1, Server: &sc})
	if err != nil {
		return err
	}
	log.Info("reverse proxy", "addr", addr.String(), "upstream", upstream.String(), "routes", len(cfg.ProxyRoutes))
	return nil
}
