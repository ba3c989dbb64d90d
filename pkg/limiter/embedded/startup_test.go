package embedded

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// failRules: one rule per fail policy, and one in shadow.
var failRules = limitertest.FailRules()

// TestEmbeddedStartsWithRedisDown: the limiter starts while Redis is
// unreachable and answers at once from its fail policies (on main it refused
// to start, naming the wrong cause).
func TestEmbeddedStartsWithRedisDown(t *testing.T) {
	rdb := redistest.Dead(t)
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
