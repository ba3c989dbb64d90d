// Package app wires the limiter: Redis, the rules and their reloader, the
// decision engine, the decision-event producer, the InfluxDB counts and the HTTP
// API, with an orderly shutdown.
package app

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"golang.org/x/net/netutil"
	"log/slog"
	"net"
	"net/http"
	"net/http/pprof"
	"net/url"
	"os"
	"os/signal"
	"syscall"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"
	"google.golang.org/grpc"
	"google.golang.org/grpc/health"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// Run serves until ctx is done, then drains: not ready → stop accepting → finish
// in-flight checks → flush queued decision events and counts → close clients.
// defaultRules is the rules file used when FLOODGATE_LIMITER_RULES is unset.
func Run(ctx context.Context, getenv config.Getenv, log *slog.Logger, defaultRules []byte) error {
	cfg, err := ConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

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

	rdb := redisx.NewClient(redisx.Options{Addrs: cfg.RedisAddrs, SentinelMaster: cfg.SentinelMaster, SentinelAddrs: cfg.SentinelAddrs, DialTimeout: time.Second,
		ReadTimeout: cfg.RedisTimeout, WriteTimeout: cfg.RedisTimeout})
	defer rdb.Close()

	var counts *limiter.ScopeCounts
	var observer limiter.Observer
	if cfg.InfluxInterval > 0 {
		influx := influxdb2.NewClient(cfg.InfluxURL, cfg.InfluxToken)
		defer influx.Close()
		counts = limiter.NewScopeCounts(influx, cfg.InfluxOrg, cfg.InfluxBucket, cfg.Gateway, time.Now, log)
		observer = counts
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	core, err := limiter.NewEmbedded(startCtx, limiter.EmbedConfig{
		Redis: rdb, Rules: rules, RulesFile: cfg.RulesPath, RulesPoll: cfg.RulesPoll, Reload: hup,
		Brokers: cfg.KafkaBrokers, Topic: cfg.DecisionsTopic, Journal: cfg.Journal, EventBuffer: cfg.EventBuffer,
		Gateway: cfg.Gateway, Observer: observer,
		Budget: cfg.RedisTimeout, BreakerFailures: cfg.BreakerFailures, BreakerOpen: cfg.BreakerOpen,
		OverLimitEntries: cmp.Or(cfg.OverLimitCache, -1), RedisBatch: cfg.RedisBatch, Shadow: cfg.Shadow,
		RuntimePoll: cfg.RuntimePoll, Logger: log, Registry: reg, Callers: cfg.Callers,
	})
	cancel()
	if err != nil {
		if cfg.RulesPath != "" && errors.Is(err, limiter.ErrRulesFile) {
			return fmt.Errorf("FLOODGATE_LIMITER_RULES: %w", err)
		}
		return fmt.Errorf("start limiter: %w", err)
	}
	srv := core.Server()
	srv.SetReady(false) // ready once every listener is up
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	// Bounded connections and timeouts: an idle keep-alive connection is
	// closed after IdleTimeout, a slow client after the read/write timeouts,
	// and at most MaxConns connections are served at once (issue 22 S6).
	ln = netutil.LimitListener(ln, cfg.MaxConns)
	httpSrv := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second, ReadTimeout: 10 * time.Second,
		WriteTimeout: 10 * time.Second, IdleTimeout: cfg.IdleTimeout, MaxHeaderBytes: 16 << 10}

	// Envoy's rate-limit service and gRPC health on FLOODGATE_LIMITER_GRPC_ADDR.
	// envoy ratelimit's configuration, served on the gRPC API beside Floodgate's own.
	var envoySrc *envoyconf.Source
	var envoyHup chan os.Signal
	if cfg.EnvoyConfigDir != "" {
		if envoySrc, err = envoyconf.OpenDir(cfg.EnvoyConfigDir, envoyconf.Options{MergeDomains: cfg.EnvoyMerge}, log); err != nil {
			return fmt.Errorf("FLOODGATE_LIMITER_ENVOY_CONFIG: %w", err)
		}
		envoyHup = make(chan os.Signal, 1)
		signal.Notify(envoyHup, syscall.SIGHUP)
		defer signal.Stop(envoyHup)
		log.Info("envoy ratelimit configuration loaded", "dir", cfg.EnvoyConfigDir, "domains", envoySrc.Config().Domains())
	}
	var grpcSrv *grpc.Server
	var grpcLn net.Listener
	var hs *health.Server
	if cfg.GRPCAddr != "off" {
		grpcLn, err = net.Listen("tcp", cfg.GRPCAddr)
		switch {
		case err != nil && cfg.GRPCAddrSet:
			ln.Close()
			return fmt.Errorf("listen %s (FLOODGATE_LIMITER_GRPC_ADDR): %w", cfg.GRPCAddr, err)
		case err != nil: // the default port is taken (another limiter on this host): say so, serve HTTP
			log.Warn("envoy rate-limit service not started; set FLOODGATE_LIMITER_GRPC_ADDR", "addr", cfg.GRPCAddr, "err", err)
			grpcLn = nil
		default:
			var opts []limiter.GRPCOption
			if envoySrc != nil {
				opts = append(opts, limiter.WithEnvoyConfig(&limiter.EnvoyConfig{Source: envoySrc,
					Evaluator: &envoyconf.Evaluator{Redis: rdb, Prefix: "fg:envoy:", GlobalShadow: cfg.EnvoyShadow}}))
			}
			grpcSrv, hs = limiter.NewGRPCServer(srv, opts...)
		}
	}
	// net/http/pprof on its own listener, off unless FLOODGATE_LIMITER_DEBUG_ADDR is set.
	var debugSrv *http.Server
	var debugLn net.Listener
	if cfg.DebugAddr != "" {
		if debugLn, err = net.Listen("tcp", cfg.DebugAddr); err != nil {
			ln.Close()
			return fmt.Errorf("listen %s (FLOODGATE_LIMITER_DEBUG_ADDR): %w", cfg.DebugAddr, err)
		}
		mux := http.NewServeMux()
		mux.HandleFunc("/debug/pprof/", pprof.Index)
		mux.HandleFunc("/debug/pprof/cmdline", pprof.Cmdline)
		mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
		mux.HandleFunc("/debug/pprof/symbol", pprof.Symbol)
		mux.HandleFunc("/debug/pprof/trace", pprof.Trace)
		debugSrv = &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	}

	var proxySrv *http.Server
	var proxyLn net.Listener
	if cfg.ProxyAddr != "" {
		if proxySrv, proxyLn, err = newProxy(cfg, srv, log); err != nil {
			ln.Close()
			return err
		}
	}

	// The producer and the counts outlive the HTTP server so the last decisions still get out.
	tailCtx, stopTail := context.WithCancel(context.WithoutCancel(ctx))
	var g errgroup.Group
	g.Go(func() error { return core.Run(tailCtx) })
	if envoySrc != nil {
		g.Go(func() error { return envoySrc.Run(tailCtx, 2*time.Second, envoyHup) })
	}
	if counts != nil {
		g.Go(func() error { return counts.Run(tailCtx, cfg.InfluxInterval) })
	}
	g.Go(func() error {
		if err := httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	if grpcSrv != nil {
		g.Go(func() error { return grpcSrv.Serve(grpcLn) })
	}
	if proxySrv != nil {
		g.Go(func() error {
			if err := proxySrv.Serve(proxyLn); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	if debugSrv != nil {
		g.Go(func() error {
			if err := debugSrv.Serve(debugLn); !errors.Is(err, http.ErrServerClosed) {
				return err
			}
			return nil
		})
	}
	srv.SetReady(true)
	if hs != nil {
		limiter.SetServing(hs, true)
	}
	grpcAddr := "off"
	if grpcLn != nil {
		grpcAddr = grpcLn.Addr().String()
	}
	log.Info("limiter serving", "addr", ln.Addr().String(), "grpc_addr", grpcAddr, "debug_addr", cfg.DebugAddr, "redis", cfg.RedisAddrs, "kafka", cfg.KafkaBrokers,
		"topic", cfg.DecisionsTopic, "rules", core.Rules().Source, "rule_count", len(core.Rules().Rules), "shadow", core.Rules().Shadow || cfg.Shadow)

	<-ctx.Done()
	srv.SetReady(false)
	if hs != nil {
		hs.Shutdown() // every service NOT_SERVING
	}
	log.Info("limiter draining")
	shutCtx, cancelShut := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancelShut()
	if grpcSrv != nil {
		stopped := make(chan struct{})
		go func() { grpcSrv.GracefulStop(); close(stopped) }()
		select {
		case <-stopped:
		case <-shutCtx.Done():
			grpcSrv.Stop()
		}
	}
	if proxySrv != nil {
		if err := proxySrv.Shutdown(shutCtx); err != nil {
			log.Warn("proxy shutdown", "err", err)
		}
	}
	if err := httpSrv.Shutdown(shutCtx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	if debugSrv != nil {
		_ = debugSrv.Close()
	}
	stopTail()
	return g.Wait()
}

// newProxy builds the limiter's reverse-proxy mode: pkg/gateway's reverse proxy in
// front of the upstream, deciding in-process with the limiter's own engine.
func newProxy(cfg Config, srv *limiter.Server, log *slog.Logger) (*http.Server, net.Listener, error) {
	upstream, err := url.Parse(cfg.ProxyUpstream)
	if err != nil {
		return nil, nil, fmt.Errorf("FLOODGATE_LIMITER_PROXY_UPSTREAM: %w", err)
	}
	router, err := gateway.NewRouter(cfg.ProxyRoutes, "")
	if err != nil {
		return nil, nil, fmt.Errorf("FLOODGATE_LIMITER_PROXY_ROUTES: %w", err)
	}
	handler, err := gateway.NewReverseProxy(upstream, gateway.Options{
		Checker: srv.Embedded(), Router: router, TrustedProxies: cfg.ProxyTrusted, Logger: log,
		Principal: gateway.PrincipalFromHeaders(cfg.ProxyKindHeader, cfg.ProxyIDHeader, cfg.ProxyTrusted),
		Timeout:   cfg.RedisTimeout * 4,
	})
	if err != nil {
		return nil, nil, err
	}
	ln, err := net.Listen("tcp", cfg.ProxyAddr)
	if err != nil {
		return nil, nil, fmt.Errorf("listen %s (FLOODGATE_LIMITER_PROXY_ADDR): %w", cfg.ProxyAddr, err)
	}
	log.Info("reverse proxy", "addr", ln.Addr().String(), "upstream", upstream.String(), "routes", len(cfg.ProxyRoutes))
	return &http.Server{Handler: handler, ReadHeaderTimeout: 5 * time.Second}, ln, nil
}
