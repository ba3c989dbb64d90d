// Package app wires the deferred-work worker: Redis, the limiter client, the
// upstream client, the consumer group on floodgate.deferred.v1 and the
// health and metrics endpoints.
package app

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tick"
	"github.com/floodgate-dev/floodgate/services/deferred/internal/worker"
)

// Run serves until ctx is done, then drains: not ready → stop fetching →
// in-flight replays finish (or are cancelled at the drain deadline, not
// committed, and replayed again by the next owner) → commit → close.
func Run(ctx context.Context, env service.Env) error {
	if len(env.Args) > 0 {
		return fmt.Errorf("usage: deferred (no arguments; got %q)", env.Args)
	}
	log, reg := env.Log, env.Registry
	cfg, run, err := service.Start(env, ConfigFromEnv, httpapi.DefaultServerConfig())
	if err != nil {
		return err
	}
	rdb, ksec, err := run.Connect(ctx, cfg.Backends)
	if err != nil {
		return err
	}
	store := deferred.NewStore(rdb)
	metrics := worker.NewMetrics(reg)
	w := worker.New(worker.Options{
		Store: store,
		Limiter: &worker.LimiterClient{URL: cfg.LimiterURL, Token: cfg.LimiterToken.Reveal(),
			HTTP: &http.Client{Timeout: cfg.LimiterTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64}}},
		Upstream: cfg.Upstream,
		HTTP: &http.Client{Timeout: cfg.UpstreamTimeout, Transport: &http.Transport{MaxIdleConnsPerHost: 64},
			CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }},
		ServiceToken: cfg.ServiceToken.Reveal(), SigningKey: []byte(cfg.SigningKey.Reveal()),
		ResultTTL: cfg.ResultTTL, ResultMaxBody: cfg.ResultMaxBody, ResultHeaders: cfg.ResultHeaders,
		MinBackoff: 50 * time.Millisecond, MaxBackoff: cfg.MaxBackoff,
		Metrics: metrics, Logger: log, Now: env.Now,
	})
	sc := stream.ConsumerConfig{
		Brokers: cfg.KafkaBrokers, Security: ksec, Topic: cfg.Topic, GroupID: cfg.Group, Service: "deferred",
		// Expired and refused requests are dead-lettered by the handler at
		// once (Permanent, with the reason); a Redis failure is retried
		// until it passes, never dead-lettered: the request is not done.
		MaxAttempts: 1 << 30, InitialBackoff: 50 * time.Millisecond, MaxBackoff: cfg.MaxBackoff,
		DrainTimeout: cfg.DrainTimeout, CommitInterval: 200 * time.Millisecond,
		Logger: log, Registerer: reg, Tracing: env.Tracing,
	}
	cfg.Door.Apply(&sc)
	consumer, err := stream.NewConsumer(sc, w.Handle)
	if err != nil {
		_ = rdb.Close()
		return fmt.Errorf("deferred consumer: %w", err)
	}
	addr, err := run.Serve(service.API{Name: "health", Addr: cfg.HTTPAddr, Health: true})
	if err != nil {
		_ = rdb.Close()
		return err
	}
	run.Worker("deferred consumer", consumer.Run)
	run.Worker("queue depth", func(ctx context.Context) error { return pollDepth(ctx, store, metrics) })
	log.Info("deferred worker starting", "addr", addr.String(), "topic", cfg.Topic, "group", cfg.Group, "upstream", cfg.Upstream, "limiter", cfg.LimiterURL)
	return run.Run(ctx)
}

// pollDepth keeps floodgate_deferred_queued current for the routes this
// worker has seen.
func pollDepth(ctx context.Context, store *deferred.Store, m *worker.Metrics) error {
	return tick.Every(ctx, 5*time.Second, func(ctx context.Context) {
		for _, route := range m.Routes() {
			if d, err := store.Depth(ctx, route); err == nil {
				m.Depth.WithLabelValues(route).Set(float64(d.Queued))
			}
		}
	})
}
