// Package app wires the detector: the decisions consumer that scores and
// penalizes, the abuse consumer that pages, and their telemetry.
package app

import (
	"context"
	"fmt"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector"
	"github.com/floodgate-dev/floodgate/services/detector/internal/sharedip"
)

// Run serves until ctx is done; `detector propose` builds tuning proposals
// (propose.go).
func Run(ctx context.Context, env service.Env) error {
	if len(env.Args) > 0 && env.Args[0] == "propose" {
		return Propose(ctx, env, env.Args[1:])
	}
	if len(env.Args) > 0 {
		return fmt.Errorf("unknown command %q: the detector takes none but propose", env.Args[0])
	}
	run, err := Build(ctx, env)
	if err != nil {
		return err
	}
	return run.Run(ctx)
}

// Build connects the detector's backends and hands its parts to a runner:
// the decisions consumer that scores and penalizes, the abuse consumer that
// pages, the maintenance loops and /healthz, /readyz, /metrics. The runner
// stops them all when ctx is done or one of them fails: not ready, stop
// fetching, drain and commit, then flush the abuse producer and the
// recorder and close the clients. With env.Tracing on, every decision
// handled is a "process" span continuing the limiter's trace, and abuse
// events carry it on to the pager. On an error nothing is left open.
func Build(ctx context.Context, env service.Env) (_ *service.Runner, err error) {
	log, reg := env.Log, env.Registry
	cfg, run, err := service.Start(env, detector.ServiceConfigFromEnv, httpapi.DefaultServerConfig())
	if err != nil {
		return nil, err
	}
	rdb, ksec, err := run.Connect(ctx, cfg.Backends)
	if err != nil {
		return nil, err
	}
	defer func() {
		if err != nil {
			_ = rdb.Close()
		}
	}()

	influx := influxdb2.NewClientWithOptions(cfg.InfluxURL, cfg.InfluxToken, influxdb2.DefaultOptions().SetBatchSize(500).SetFlushInterval(1000))
	run.Closer("influxdb", func() error { influx.Close(); return nil })
	recorder := detector.NewInfluxRecorder(influx, cfg.InfluxOrg, cfg.InfluxBucket, log)
	run.Closer("influxdb points", func() error { recorder.Flush(); return nil })

	producer := stream.NewProducer(stream.ProducerConfig{Brokers: cfg.KafkaBrokers, Security: ksec, Logger: log, Registerer: reg, Tracing: env.Tracing})
	run.Closer("abuse producer", producer.Close) // after the consumers drained: flushes their last abuse events

	var records *detector.DynamoRecords
	allow := &detector.Allowlist{}
	if cfg.Records == "dynamodb" {
		ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: cfg.DynamoEndpoint, TablePrefix: cfg.DynamoPrefix})
		if err != nil {
			return nil, err
		}
		records = &detector.DynamoRecords{Client: ddb, AbuseTable: cfg.DynamoPrefix + dynamo.TableAbuseRecords,
			RuntimeTable: cfg.DynamoPrefix + dynamo.TableRuntimeConfig, Retention: cfg.RecordRetention}
		loadCtx, cancel := context.WithTimeout(ctx, 10*time.Second)
		entries, err := records.LoadAllowlist(loadCtx, env.Now())
		cancel()
		if err != nil {
			return nil, fmt.Errorf("dynamodb (FLOODGATE_DYNAMODB_ENDPOINT, or FLOODGATE_DETECTOR_RECORDS=off): %w", err)
		}
		allow.Set(entries)
	} else {
		log.Warn("abuse records, escalation and allowlists disabled: FLOODGATE_DETECTOR_RECORDS=off")
	}

	var pager *detector.Pager
	if cfg.PagerRoutingKey != "" {
		pager, err = detector.NewPager(detector.PagerConfig{
			RoutingKey: cfg.PagerRoutingKey, Endpoint: cfg.PagerURL, MinSeverity: cfg.PagerSeverity, PerMinute: cfg.PagerPerMinute,
			Redis: rdb, Now: env.Now, Logger: log, Registerer: reg,
		})
		if err != nil {
			return nil, err
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
			return nil, err
		}
		dcfg.SharedIPs = shared
	}
	det := detector.New(dcfg)
	det.SetDayBound(detector.NewDayBound(cfg.DayBounds, reg))
	var params *detector.ParamsFeed
	var flusher *rollout.Flusher
	if cfg.ParamsTopic != "" {
		// Detector parameters versions (docs/detector.md): read up to the
		// topic's end for up to 5 s, then followed; a topic that cannot be
		// read keeps the environment's parameters and is followed afterwards.
		topic := rollout.NewTopic(cfg.KafkaBrokers, ksec, cfg.ParamsTopic, log)
		run.Closer("params topic", topic.Close)
		flusher = &rollout.Flusher{Redis: rdb, Topic: cfg.ParamsTopic, Log: log}
		params = detector.NewParamsFeed(topic, cfg.Score, det, flusher, log, reg)
		syncCtx, cancel := context.WithTimeout(ctx, 5*time.Second)
		if err := params.Sync(syncCtx); err != nil {
			log.Warn("detector parameters topic not read at start; following it", "topic", cfg.ParamsTopic, "err", err)
		}
		cancel()
	}
	// After a restart or rebalance a partition is re-read from one window back
	// (the longer of the rate and IP windows) so scoring is never blind; events
	// before the committed offset rebuild state without repeating effects.
	offsets := &detector.KafkaOffsets{Client: ksec.Client(cfg.KafkaBrokers, 10*time.Second), Topic: cfg.DecisionsTopic}
	rewind := max(cfg.Score.Window, cfg.Score.IPWindow)
	decisions, err := stream.NewConsumer(stream.ConsumerConfig{
		Brokers: cfg.KafkaBrokers, Security: ksec, Topic: cfg.DecisionsTopic, GroupID: cfg.Group, Service: "detector",
		Logger: log, Registerer: reg, StartOffset: startOffset(cfg.StartOffset), Tracing: env.Tracing,
		StartFrom: func(ctx context.Context, partition int, committed int64) (int64, error) {
			return det.Rewind(ctx, offsets, partition, committed, rewind)
		},
		OnRevoke: det.Revoked,
	}, det.Handle)
	if err != nil {
		return nil, err
	}
	var abuse *stream.Consumer
	if pager != nil {
		// A page waits out a PagerDuty outage of several minutes (retries up to 30s
		// apart) before it is dead-lettered; the abuse partition waits with it.
		abuse, err = stream.NewConsumer(stream.ConsumerConfig{
			Brokers: cfg.KafkaBrokers, Security: ksec, Topic: cfg.AbuseTopic, GroupID: cfg.PagerGroup, Service: "detector-pager",
			MaxAttempts: 25, MaxBackoff: 30 * time.Second,
			Logger: log, Registerer: reg, Tracing: env.Tracing,
		}, pager.Handle)
		if err != nil {
			return nil, err
		}
	}

	addr, err := run.Serve(service.API{Name: "health", Addr: cfg.HTTPAddr, Health: true})
	if err != nil {
		return nil, err
	}
	run.Worker("decisions consumer", decisions.Run) // stops fetching, drains and commits before it returns
	run.Worker("detector maintenance", func(ctx context.Context) error { return det.Maintain(ctx, 5*time.Second) })
	// Penalties Redis loses (FLUSHALL, a failover that dropped writes) are
	// written again within a second of the loss being seen.
	run.Worker("penalty reassert", func(ctx context.Context) error { return penalties.RunReassert(ctx, time.Second, log) })
	if shared != nil {
		run.Worker("shared ips", shared.Run)
	}
	if params != nil {
		run.Worker("params feed", params.Run)
		run.Worker("params impact", func(ctx context.Context) error { return flusher.Run(ctx, time.Second) })
	}
	if records != nil {
		run.Worker("allowlist refresh", func(ctx context.Context) error {
			return allow.Refresh(ctx, records.LoadAllowlist, cfg.AllowRefresh, env.Now, log)
		})
	}
	if abuse != nil {
		run.Worker("abuse consumer", abuse.Run)
		run.Worker("pager resolve", func(ctx context.Context) error { return pager.Resolve(ctx, cfg.PagerResolve) })
	}
	log.Info("detector starting", "addr", addr.String(), "topic", cfg.DecisionsTopic, "group", cfg.Group,
		"mode", cfg.Mode, "threshold", cfg.Score.Threshold, "floor", cfg.Score.Floor, "window", cfg.Score.Window.String())
	return run, nil
}

// startOffset maps FLOODGATE_DETECTOR_START_OFFSET to kafka-go's sentinels.
func startOffset(s string) int64 {
	if s == "last" {
		return kafka.LastOffset
	}
	return kafka.FirstOffset
}
