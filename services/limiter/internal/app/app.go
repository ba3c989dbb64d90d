// Package app wires the limiter: Redis, the decision engine, the decision-event
// producer and the HTTP API, with an orderly shutdown.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"golang.org/x/sync/errgroup"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/limiter/internal/limiter"
)

// Run serves until ctx is done, then drains: not ready → stop accepting → finish
// in-flight checks → flush queued decision events → close clients.
func Run(ctx context.Context, getenv config.Getenv, log *slog.Logger) error {
	cfg, err := limiter.ConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	rdb := redisx.NewClient(redisx.Options{Addrs: cfg.RedisAddrs, DialTimeout: time.Second,
		ReadTimeout: cfg.RedisTimeout, WriteTimeout: cfg.RedisTimeout})
	defer rdb.Close()

	rules := []limiter.Rule{{Tier: events.TierPrincipal, Limit: cfg.PrincipalLimit, Period: cfg.PrincipalPeriod}}
	engine, err := limiter.NewEngine(rdb, rules)
	if err != nil {
		return err
	}
	startCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err = engine.Load(startCtx)
	cancel()
	if err != nil {
		return fmt.Errorf("load check script into redis %v: %w", cfg.RedisAddrs, err)
	}

	pcfg := stream.AsyncProducerConfig{
		Name: "decisions", Brokers: cfg.KafkaBrokers, BufferSize: cfg.EventBuffer, Logger: log, Registerer: reg,
	}
	if err := pcfg.Validate(); err != nil {
		return err
	}
	producer := stream.NewAsyncProducer(pcfg)
	srv := limiter.NewServer(limiter.ServerConfig{
		Engine: engine, Rules: rules, Publisher: producer, Topic: cfg.DecisionsTopic,
		Gateway: cfg.Gateway, RedisTimeout: cfg.RedisTimeout, Logger: log, Registry: reg,
	})
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	httpSrv := &http.Server{Handler: srv.Handler(), ReadHeaderTimeout: 5 * time.Second}

	// The producer outlives the HTTP server so the last decisions still get out.
	producerCtx, stopProducer := context.WithCancel(context.WithoutCancel(ctx))
	var g errgroup.Group
	g.Go(func() error { return producer.Run(producerCtx) })
	g.Go(func() error {
		if err := httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	srv.SetReady(true)
	log.Info("limiter serving", "addr", ln.Addr().String(), "redis", cfg.RedisAddrs, "kafka", cfg.KafkaBrokers, "topic", cfg.DecisionsTopic)

	<-ctx.Done()
	srv.SetReady(false)
	log.Info("limiter draining")
	shutCtx, cancelShut := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancelShut()
	if err := httpSrv.Shutdown(shutCtx); err != nil {
		log.Warn("http shutdown", "err", err)
	}
	stopProducer()
	return g.Wait()
}
