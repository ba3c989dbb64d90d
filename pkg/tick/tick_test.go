package tick

import (
	"context"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEveryCallsUntilCancelled(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithCancel(context.Background())
	var calls atomic.Int64
	done := make(chan error, 1)
	go func() {
		done <- Every(ctx, time.Millisecond, func(got context.Context) {
			if got != ctx {
				t.Error("fn got another context")
			}
			if calls.Add(1) == 3 {
				cancel()
			}
		})
	}()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Every did not return after its context was cancelled")
	}
	require.GreaterOrEqual(t, calls.Load(), int64(3))
}

func TestEveryWaitsAnIntervalBeforeTheFirstCall(t *testing.T) {
	t.Parallel()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Millisecond)
	defer cancel()
	called := false
	require.NoError(t, Every(ctx, time.Hour, func(context.Context) { called = true }))
	require.False(t, called)
}
