package app

import (
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/embedded"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// newDeferrer builds the reverse proxy's deferral (issue 23, docs/deferred.md):
// requests on routes whose rule says on_limit: defer are, when denied or shed,
// written to FLOODGATE_DEFERRED_TOPIC with acks=all and answered 202. The
// rules in force decide which routes defer, so a rules reload applies at once;
// with no deferrable route nothing is written (the producer connects lazily).
func newDeferrer(env service.Env, cfg Config, core *embedded.Limiter, rdb redis.UniversalClient, ksec *stream.Security, run *service.Runner) (gateway.Deferrer, error) {
	e := config.NewEnv(env.Getenv)
	topic := e.String("FLOODGATE_DEFERRED_TOPIC", deferred.DefaultTopic)
	ttl := e.Duration("FLOODGATE_DEFERRED_RESULT_TTL", 24*time.Hour)
	write := e.Duration("FLOODGATE_LIMITER_DEFER_WRITE_TIMEOUT", 5*time.Second)
	if err := e.Err(); err != nil {
		return nil, err
	}
	var v config.Check
	v.Require(ttl >= time.Minute && ttl <= 30*24*time.Hour, "FLOODGATE_DEFERRED_RESULT_TTL", "%s: must be in 1m..720h", ttl)
	v.Require(write >= 10*time.Millisecond && write <= time.Minute, "FLOODGATE_LIMITER_DEFER_WRITE_TIMEOUT", "%s: must be in 10ms..1m", write)
	pc := stream.ProducerConfig{Brokers: cfg.KafkaBrokers, Security: ksec, Topic: topic, Logger: env.Log, WriteTimeout: write,
		// The edge retries a failed write itself while the client waits; kafka-go's
		// retries would go on after the client got its 429 (docs/deferred.md).
		MaxAttempts: 1,
		MetadataTTL: time.Second} // follow a partition leader's move within a second
	if err := pc.Validate(); err != nil {
		return nil, err
	}
	if err := v.Err(); err != nil {
		return nil, err
	}
	p := stream.NewProducer(pc)
	run.Closer("deferred producer", p.Close)
	return deferred.NewEdge(deferred.EdgeConfig{
		Policy: func(method, route string) *limiter.DeferPolicy { return core.Rules().Deferral(method, route) },
		Redis:  rdb, Producer: p, Topic: topic, Gateway: cfg.Gateway, ResultTTL: ttl, WriteTimeout: write,
		Logger: env.Log, Registerer: env.Registry,
	})
}
