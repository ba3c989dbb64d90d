// Package backends reads config.Backends, the Redis and Kafka settings of a
// service that needs both. It is apart from package config so that only the
// programs that read those variables import the code reading them: the
// deployment checks (deploy/packaging_test.go) hold a program to setting
// every endpoint variable found in its imports, and a service without Redis
// (the dlq-auditor) imports config.
package backends

import "github.com/floodgate-dev/floodgate/pkg/config"

// Read reads the addresses of Redis and the Kafka brokers and their
// transport settings into e.
func Read(e *config.Env) config.Backends {
	return config.Backends{
		RedisAddrs:    e.List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs),
		RedisSecurity: config.ReadRedisSecurity(e),
		KafkaBrokers:  e.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers),
		KafkaSecurity: config.ReadKafkaSecurity(e),
	}
}
