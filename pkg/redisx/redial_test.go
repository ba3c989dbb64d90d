package redisx_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// downServer is a redis-server of the test's own, killed, and a client
// (a pool of two) of its address.
func downServer(t *testing.T) (*redistest.Proc, redis.UniversalClient) {
	t.Helper()
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	p := redistest.NewProc(t)
	p.Kill()
	return p, redisx.NewClient(redisx.Options{Addrs: []string{p.Addr}, DialTimeout: 200 * time.Millisecond, PoolSize: 2})
}

// TestDialWaitsForTheServer: after more failed commands than the pool has
// connections while the server is down — go-redis's pool then stops dialing
// and fails every command at once until its probe, once a second, gets
// through — a command waiting for its connection gets it from the server
// started meanwhile, on the same address (issue 38: a promoted replica was
// used up to a second late).
func TestDialWaitsForTheServer(t *testing.T) {
	p, rdb := downServer(t)
	t.Cleanup(func() { _ = rdb.Close() })
	for range 10 {
		ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
		require.Error(t, rdb.Ping(ctx).Err())
		cancel()
	}
	time.Sleep(time.Second) // the failed dials' own retries are over
	require.ErrorContains(t, rdb.(*redisx.Node).RootCause(context.DeadlineExceeded), "connection refused")

	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	done := make(chan error, 1)
	go func() { done <- rdb.Ping(ctx).Err() }()
	time.Sleep(200 * time.Millisecond)
	require.NoError(t, p.Start())
	require.NoError(t, <-done, "the command got a connection to the server once it was up")
}

// TestCloseEndsDialsWaitingForTheServer: a command without a deadline
// waiting for a server that is down returns once the client is closed.
func TestCloseEndsDialsWaitingForTheServer(t *testing.T) {
	_, rdb := downServer(t)
	done := make(chan error, 1)
	go func() { done <- rdb.Ping(context.Background()).Err() }()
	time.Sleep(300 * time.Millisecond)
	require.NoError(t, rdb.Close())
	select {
	case err := <-done:
		require.Error(t, err)
	case <-time.After(10 * time.Second): // it would wait for the server 30 s
		t.Fatal("a dial kept waiting for the server after Close")
	}
}
