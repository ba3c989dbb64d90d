package chaos

import (
	"context"
	"log/slog"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestChaosQuick runs the CI subset of the fault scenarios (broker killed
// under limiter load, quota consumers SIGKILLed, DynamoDB write errors)
// against processes it starts itself and DynamoDB Local, and fails when an
// acknowledged decision event is lost or the ledger is not exact.
func TestChaosQuick(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server, brokers and the services, and needs DynamoDB Local; run `make test`")
	}
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Minute)
	defer cancel()
	endpoint := os.Getenv("FLOODGATE_DYNAMODB_ENDPOINT")
	e, err := NewEnv(ctx, Options{DynamoEndpoint: endpoint, Logger: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))})
	require.NoError(t, err)
	defer e.Close()
	results := RunAll(ctx, e, Quick, true, func(r Result) { t.Log(r.Line()) })
	require.NotEmpty(t, results)
	for _, r := range results {
		t.Run(r.Name, func(t *testing.T) {
			require.NoError(t, r.Err, "logs in %s (kept on failure)", e.Dir)
			for _, inv := range r.Invariants {
				require.True(t, inv.OK, "%s: %s", inv.Name, inv.Detail)
			}
		})
	}
	if t.Failed() {
		e.Keep()
	}
}
