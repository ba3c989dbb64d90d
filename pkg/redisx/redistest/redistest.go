// Package redistest connects tests to the real Redis of the local stack.
package redistest

import (
	"context"
	"fmt"
	"net"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// Client returns a client for FLOODGATE_REDIS_ADDRS (default 127.0.0.1:6379) and
// fails the test, loudly, when Redis does not answer: integration tests never
// skip because a component is missing. Tests share the server, so they use keys
// no other test uses (see Unique).
func Client(t testing.TB) redis.UniversalClient {
	t.Helper()
	if testing.Short() {
		t.Skip("needs the local stack's Redis: `make test` runs it (`make test-unit` is -short, no stack)")
	}
	addrs := config.NewEnv(os.Getenv).List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs)
	c := redisx.NewClient(redisx.Options{Addrs: addrs, DialTimeout: time.Second})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	if err := redisx.Ping(ctx, c); err != nil {
		t.Fatalf("redis at %v is not reachable — start the local stack with `make up`: %v", addrs, err)
	}
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Dead returns a client of an address nothing listens on (a port just freed),
// dialing with a 200 ms timeout; it is closed after the test.
func Dead(t testing.TB) redis.UniversalClient {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("listen: %v", err)
	}
	addr := ln.Addr().String()
	if err := ln.Close(); err != nil {
		t.Fatalf("close listener: %v", err)
	}
	c := redisx.NewClient(redisx.Options{Addrs: []string{addr}, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// Unique returns a name no other test run uses, for principal ids and key prefixes.
func Unique(t testing.TB, base string) string {
	return fmt.Sprintf("%s_%d", base, time.Now().UnixNano())
}
