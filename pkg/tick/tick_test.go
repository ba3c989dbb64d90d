package tick

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEveryCallsUntilCancelled(t *testing.T) {
	t.Parallel()
	// The timeout only guards the test: Every returns once fn cancels.
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	calls := 0
	require.NoError(t, Every(ctx, time.Millisecond, func(got context.Context) {
		require.Equal(t, ctx, got)
		if calls++; calls == 3 {
			cancel()
		}
	}))
	require.Equal(t, 3, calls, "Every returned before its context was cancelled")
}

func TestEveryWaitsAnIntervalBeforeTheFirstCall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	called := false
	require.NoError(t, Every(ctx, time.Hour, func(context.Context) { called = true }))
	require.False(t, called)
}
