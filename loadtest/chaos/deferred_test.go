package chaos

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestDeferredExactlyOnceUnderKills runs the deferred-kill scenario: 5,000
// orders at 5× their limit through the limiter's reverse proxy to a real HTTP
// upstream, the broker and the worker each SIGKILLed once; every order is
// applied exactly once before its deadline, visibly expired, or refused with a
// 429 and never applied.
func TestDeferredExactlyOnceUnderKills(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, a broker, the limiter and the worker; run `make test`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	e, err := NewEnv(ctx, Options{DynamoEndpoint: os.Getenv("FLOODGATE_DYNAMODB_ENDPOINT"),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	defer e.Close()
	defer func() { // runs before Close: a failed run keeps every process's log
		if t.Failed() {
			e.Keep()
		}
	}()
	results := RunAll(ctx, e, Quick, false, func(r Result) { t.Log(r.Line()) }, "deferred-kill")
	require.Len(t, results, 1)
	r := results[0]
	for _, m := range r.Metrics {
		t.Logf("%s: %s", m.Name, m.Value)
	}
	require.NoError(t, r.Err, "logs in %s (kept on failure)", e.Dir)
	for _, inv := range r.Invariants {
		require.True(t, inv.OK, "%s: %s", inv.Name, inv.Detail)
	}
}
