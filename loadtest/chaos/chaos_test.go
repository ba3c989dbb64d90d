package chaos

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestChaosQuick runs the CI subset of the fault scenarios (broker killed
// under limiter load, quota consumers SIGKILLed, DynamoDB write errors)
// against processes it starts itself and DynamoDB Local, and fails when an
// acknowledged decision event is lost or the ledger is not exact.
func TestChaosQuick(t *testing.T) {
	ctx, e := testEnv(t, "starts redis-server, brokers and the services, and needs DynamoDB Local; run `make test`")
	results := RunAll(ctx, e, Quick, true, func(r Result) { t.Log(r.Line()) })
	require.NotEmpty(t, results)
	for _, r := range results {
		t.Run(r.Name, func(t *testing.T) { requireHeld(t, e, r) })
	}
}

// TestDeferredExactlyOnceUnderKills runs the deferred-kill scenario: 5,000
// orders at 5× their limit through the limiter's reverse proxy to a real HTTP
// upstream, the broker and the worker each SIGKILLed once; every order is
// applied exactly once before its deadline, visibly expired, or refused with a
// 429 and never applied.
func TestDeferredExactlyOnceUnderKills(t *testing.T) {
	ctx, e := testEnv(t, "starts redis-server, a broker, the limiter and the worker; run `make test`")
	results := RunAll(ctx, e, Quick, false, func(r Result) { t.Log(r.Line()) }, "deferred-kill")
	require.Len(t, results, 1)
	r := results[0]
	for _, m := range r.Metrics {
		t.Logf("%s: %s", m.Name, m.Value)
	}
	requireHeld(t, e, r)
}

// testEnv is a scenario environment on DynamoDB Local (skipped under
// -short, needs says why), closed at the end of the test and kept — every
// process's log — when the test failed.
func testEnv(t *testing.T, needs string) (context.Context, *Env) {
	ctx := stacktest.Context(t, 10*time.Minute, needs)
	e, err := NewEnv(ctx, Options{DynamoEndpoint: os.Getenv("FLOODGATE_DYNAMODB_ENDPOINT"),
		Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	t.Cleanup(func() {
		if t.Failed() {
			e.Keep()
		}
		e.Close()
	})
	return ctx, e
}

// requireHeld fails t when the scenario failed or broke an invariant.
func requireHeld(t *testing.T, e *Env, r Result) {
	t.Helper()
	require.NoError(t, r.Err, "logs in %s (kept on failure)", e.Dir)
	for _, inv := range r.Invariants {
		require.True(t, inv.OK, "%s: %s", inv.Name, inv.Detail)
	}
}
