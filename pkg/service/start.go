package service

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Start is the first step of every service's Serve: read reads and validates
// the service's own configuration, then the runner reads its share
// (FLOODGATE_SHUTDOWN_TIMEOUT, FLOODGATE_HTTP_* over httpDefaults). Either
// error comes back as "config: …", naming the variable.
func Start[C any](env Env, read func(config.Getenv) (C, error), httpDefaults httpapi.ServerConfig) (C, *Runner, error) {
	cfg, err := read(env.Getenv)
	if err != nil {
		return cfg, nil, fmt.Errorf("config: %w", err)
	}
	run, err := NewRunner(env, httpDefaults)
	if err != nil {
		return cfg, nil, fmt.Errorf("config: %w", err)
	}
	return cfg, run, nil
}

// Connect returns a Redis client once Redis answers (redisx.Connect; the
// runner closes it last) and the Kafka transport once the brokers accept it
// (stream.Secure, as "kafka: …" when they do not). On an error nothing is
// left open. Until Run, a caller that gives up closes the client itself.
func (r *Runner) Connect(ctx context.Context, b config.Backends) (redis.UniversalClient, *stream.Security, error) {
	rdb, err := redisx.Connect(ctx, redisx.Options{Addrs: b.RedisAddrs, DialTimeout: time.Second, Security: b.RedisSecurity}, r.env.Log)
	if err != nil {
		return nil, nil, err
	}
	ksec, err := stream.Secure(ctx, b.KafkaBrokers, b.KafkaSecurity, 10*time.Second, r.env.Log)
	if err != nil {
		_ = rdb.Close()
		return nil, nil, fmt.Errorf("kafka: %w", err)
	}
	r.Closer("redis", rdb.Close)
	return rdb, ksec, nil
}
