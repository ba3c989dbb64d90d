package redisx

import (
	"context"
	"fmt"
	"time"

	"github.com/redis/go-redis/v9"
)

// Options configure a client; Addrs with more than one entry means Redis Cluster.
type Options struct {
	Addrs        []string
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	PoolSize     int
}

// NewClient returns a standalone client for one address and a cluster client for several.
// go-redis routes EVALSHA by the first key's slot, which the hash-tag key layout keeps
// on the principal's slot.
func NewClient(o Options) redis.UniversalClient {
	return redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:        o.Addrs,
		DialTimeout:  o.DialTimeout,
		ReadTimeout:  o.ReadTimeout,
		WriteTimeout: o.WriteTimeout,
		PoolSize:     o.PoolSize,
		// Several addresses are always a cluster here; never a sentinel set.
		IsClusterMode: len(o.Addrs) > 1,
	})
}

// Ping checks the client reaches Redis within ctx.
func Ping(ctx context.Context, c redis.UniversalClient) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}
