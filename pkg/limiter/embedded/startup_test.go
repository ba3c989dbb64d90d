package embedded

import (
	"context"
	"errors"
	"log/slog"
	"net"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// failRules: one rule per fail policy, and one in shadow.
const failRules = `
version: 1
rules:
  - {id: lenient, tier: principal, kinds: [user], limit: 1, period: 1h, fail: open}
  - {id: strict, tier: principal, kinds: [bot], limit: 100, period: 1h, fail: closed}
  - {id: local, tier: principal, kinds: [api_key], limit: 2, period: 1h, fail: local}
  - {id: trial, tier: principal, kinds: [api_key], limit: 1, period: 1h, fail: closed, shadow: true}
`

// TestEmbeddedStartsWithRedisDown: the limiter starts while Redis is
// unreachable and answers at once from its fail policies (on main it refused
// to start, naming the wrong cause).
func TestEmbeddedStartsWithRedisDown(t *testing.T) {
	rdb := deadRedis(t)
	rs, err := limiter.ParseRules("test.yaml", []byte(failRules))
	require.NoError(t, err)
	start := time.Now()
	e, err := New(context.Background(), Config{Redis: rdb, Rules: rs, Gateway: "test", Publisher: limitertest.DropPublisher{},
		Logger: slog.New(slog.DiscardHandler)})
	require.NoError(t, err)
	d, err := e.Check(context.Background(), gateway.Request{Principal: events.Principal{Kind: events.PrincipalBot, ID: "b"},
		IP: "203.0.113.9", Method: "GET", Route: "/users/@me", Cost: 1})
	require.NoError(t, err)
	require.Less(t, time.Since(start), time.Second, "started and answered within a second")
	require.False(t, d.Allowed, "the bots' rule fails closed")
	require.Contains(t, d.Headers["X-RateLimit-Error"], "redis")
	require.False(t, errors.Is(err, context.DeadlineExceeded))
}

// deadRedis is a client of an address nothing listens on.
func deadRedis(t *testing.T) redis.UniversalClient {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	c := redisx.NewClient(redisx.Options{Addrs: []string{addr}, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	return c
}
