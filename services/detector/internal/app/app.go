// Package app wires the detector: the decisions consumer that scores and
// penalizes, the abuse consumer that pages, and their telemetry.
package app

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync/atomic"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/segmentio/kafka-go"
	"golang.org/x/sync/errgroup"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector"
	"github.com/floodgate-dev/floodgate/services/detector/internal/sharedip"
)

// Run consumes until ctx is done, then drains both consumers and flushes
// metrics. With tr on, every decision handled is a "process" span continuing
// the limiter's trace, and abuse events carry it on to the pager.
func Run(ctx context.Context, getenv config.Getenv, log *slog.Logger, tr tracing.Tracing) error {
	cfg, err := detector.ServiceConfigFromEnv(getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	reg := prometheus.NewRegistry()
	reg.MustRegister(service.RuntimeCollectors()...)

	rdb, err := redisx.Connect(ctx, redisx.Options{Addrs: cfg.RedisAddrs, DialTimeout: time.Second, Security: cfg.RedisSecurity}, log)
	if err != nil {
		return err
	}
	defer rdb.Close()

	ksec, err := stream.Secure(ctx, cfg.KafkaBrokers, cfg.KafkaSecurity, 10*time.Second, log)
	if err != nil {
		return fmt.Errorf("kafka: %w", err)
	}

	influx := influxdb2.NewClientWithOptions(cfg.InfluxURL, cfg.InfluxToken, influxdb2.DefaultOptions().SetBatchSize(500).SetFlushInterval(1000))
	defer influx.Close()
	recorder := detector.NewInfluxRecorder(influx, cfg.InfluxOrg, cfg.InfluxBucket, log)
	defer recorder.Flush()

	producer := stream.NewProducer(stream.ProducerConfig{Brokers: cfg.KafkaBrokers, Security: ksec, Logger: log, Registerer: reg, Tracing: tr})
	defer producer.Close()

	var records *detector.DynamoRecords
	allow := &detector.Allowlist{}
	if cfg.Records == "dynamodb" {
		ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: cfg.DynamoEndpoint, TablePrefix: cfg.DynamoPrefix})
		if err != nil {
			return err
		}
		records = &detector.DynamoRecords{Client: ddb, AbuseTable: cfg.DynamoPrefix + dynamo.TableAbuseRecords,
			RuntimeTable: cfg.DynamoPrefix + dynamo.TableRuntimeConfig, Retention: cfg.RecordRetention}
		loadCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		entries, err := records.LoadAllowlist(loadCtx, time.Now())
		cancel()
		if err != nil {
			return fmt.Errorf("dynamodb (FLOODGATE_DYNAMODB_ENDPOINT, or FLOODGATE_DETECTOR_RECORDS=off): %w", err)
		}
		allow.Set(entries)
	} else {
		log.Warn("abuse records, escalation and allowlists disabled: FLOODGATE_DETECTOR_RECORDS=off")
	}

	var pager *detector.Pager
	if cfg.PagerRoutingKey != "" {
		pager, err = detector.NewPager(detector.PagerConfig{
			RoutingKey: cfg.PagerRoutingKey, Endpoint: cfg.PagerURL, MinSeverity: cfg.PagerSeverity, PerMinute: cfg.PagerPerMinute,
			Redis: rdb, Now: time.Now, Logger: log, Registerer: reg,
		})
		if err != nil {
			return err
		}
	} else {
		log.Warn("paging disabled: FLOODGATE_PAGERDUTY_ROUTING_KEY is not set")
	}

	penalties := detector.NewPenaltyStore(rdb)
	dcfg := detector.Config{
		Score: cfg.Score, Policies: cfg.Policies, Ladder: cfg.Ladder, Escalation: cfg.Escalation, BlastLimit: cfg.BlastLimit,
		MaxEventSkew: cfg.MaxEventSkew, MaxEventAge: cfg.MaxEventAge, MaxEventCost: cfg.MaxEventCost,
		Penalties: penalties, Allowlist: allow,
		Publisher: producer, AbuseTopic: cfg.AbuseTopic, Recorder: recorder, Logger: log, Registerer: reg,
	}
	if records != nil {
		dcfg.Records = records
	}
	if pager != nil {
		dcfg.Alerter = pager
	}
	var shared *sharedip.Store
	if cfg.SharedIPs == "redis" {
		if shared, err = sharedip.New(rdb, sharedip.Config{Window: cfg.Score.IPWindow}, reg, log); err != nil {
			return err
		}
		dcfg.SharedIPs = shared
	}
	det := detector.New(dcfg)
	det.SetDayBound(detector.NewDayBound(cfg.DayBounds, reg))
	// After a restart or rebalance a partition is re-read from one window back
	// (the longer of the rate and IP windows) so scoring is never blind; events
	// before the committed offset rebuild state without repeating effects.
	offsets := &detector.KafkaOffsets{Client: ksec.Client(cfg.KafkaBrokers, 10*time.Second), Topic: cfg.DecisionsTopic}
	rewind := max(cfg.Score.Window, cfg.Score.IPWindow)
	decisions, err := stream.NewConsumer(stream.ConsumerConfig{
		Brokers: cfg.KafkaBrokers, Security: ksec, Topic: cfg.DecisionsTopic, GroupID: cfg.Group, Service: "detector",
		Logger: log, Registerer: reg, StartOffset: startOffset(cfg.StartOffset), Tracing: tr,
		StartFrom: func(ctx context.Context, partition int, committed int64) (int64, error) {
			return det.Rewind(ctx, offsets, partition, committed, rewind)
		},
		OnRevoke: det.Revoked,
	}, det.Handle)
	if err != nil {
		return err
	}

	var g errgroup.Group
	runCtx, stopRun := context.WithCancel(context.WithoutCancel(ctx))
	defer stopRun()
	g.Go(func() error { return decisions.Run(runCtx) })
	g.Go(func() error { return det.Maintain(runCtx, 5*time.Second) })
	// Penalties Redis loses (FLUSHALL, a failover that dropped writes) are
	// written again within a second of the loss being seen.
	g.Go(func() error { return penalties.RunReassert(runCtx, time.Second, log) })
	if shared != nil {
		g.Go(func() error { return shared.Run(runCtx) })
	}
	if records != nil {
		g.Go(func() error { return allow.Refresh(runCtx, records.LoadAllowlist, cfg.AllowRefresh, time.Now, log) })
	}
	if pager != nil {
		// A page waits out a PagerDuty outage of several minutes (retries up to 30s
		// apart) before it is dead-lettered; the abuse partition waits with it.
		abuse, err := stream.NewConsumer(stream.ConsumerConfig{
			Brokers: cfg.KafkaBrokers, Security: ksec, Topic: cfg.AbuseTopic, GroupID: cfg.PagerGroup, Service: "detector-pager",
			MaxAttempts: 25, MaxBackoff: 30 * time.Second,
			Logger: log, Registerer: reg, Tracing: tr,
		}, pager.Handle)
		if err != nil {
			return err
		}
		g.Go(func() error { return abuse.Run(runCtx) })
		g.Go(func() error { return pager.Resolve(runCtx, cfg.PagerResolve) })
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
	ln, err := net.Listen("tcp", cfg.HTTPAddr)
	if err != nil {
		stopRun()
		_ = g.Wait()
		return fmt.Errorf("listen %s: %w", cfg.HTTPAddr, err)
	}
	httpSrv := &http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}
	g.Go(func() error {
		if err := httpSrv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	ready.Store(true)
	log.Info("detector running", "addr", ln.Addr().String(), "topic", cfg.DecisionsTopic, "group", cfg.Group,
		"mode", cfg.Mode, "threshold", cfg.Score.Threshold, "floor", cfg.Score.Floor, "window", cfg.Score.Window.String())

	<-ctx.Done()
	ready.Store(false)
	log.Info("detector draining")
	stopRun() // consumers drain in-flight messages and commit before Run returns
	shutCtx, cancelShut := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancelShut()
	_ = httpSrv.Shutdown(shutCtx)
	return g.Wait()
}

// startOffset maps FLOODGATE_DETECTOR_START_OFFSET to kafka-go's sentinels.
func startOffset(s string) int64 {
	if s == "last" {
		return kafka.LastOffset
	}
	return kafka.FirstOffset
}
