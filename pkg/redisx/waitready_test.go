package redisx_test

import (
	"bytes"
	"context"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestWaitReadyWaitsForRedis: started while nothing listens, WaitReady
// returns once a redis-server comes up on the address (one warning logged,
// not one per attempt), and gives up only when its context ends.
func TestWaitReadyWaitsForRedis(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server")
	}
	port, err := redistest.FreePort()
	require.NoError(t, err)
	c := redisx.NewClient(redisx.Options{Addrs: []string{"127.0.0.1:" + strconv.Itoa(port)}, DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = c.Close() })
	var logs bytes.Buffer
	log := slog.New(slog.NewTextHandler(&logs, nil))

	done := make(chan error, 1)
	go func() { done <- redisx.WaitReady(context.Background(), c, log) }()
	time.Sleep(4 * time.Second) // a few attempts (each ping retries dialing inside go-redis)
	select {
	case err := <-done:
		t.Fatalf("returned while Redis was down: %v", err)
	default:
	}
	p, err := redistest.StartProc(t.TempDir(), port)
	require.NoError(t, err)
	t.Cleanup(p.Kill)
	stacktest.Returned(t, done, 10*time.Second, "WaitReady notices Redis come up")
	require.Equal(t, 1, strings.Count(logs.String(), "redis unreachable"), logs.String())

	ctx, cancel := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancel()
	p.Kill()
	require.ErrorIs(t, redisx.WaitReady(ctx, c, log), context.DeadlineExceeded)
}

// TestConnect: a client once Redis answers; nil and the error when it never
// does before the context ends.
func TestConnect(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the local Redis")
	}
	log := slog.New(slog.DiscardHandler)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	c, err := redisx.Connect(ctx, redisx.Options{Addrs: stacktest.Local().RedisAddrs, DialTimeout: time.Second}, log)
	require.NoError(t, err)
	require.NoError(t, c.Ping(ctx).Err())
	require.NoError(t, c.Close())

	port, err := redistest.FreePort()
	require.NoError(t, err)
	short, cancelShort := context.WithTimeout(context.Background(), 300*time.Millisecond)
	defer cancelShort()
	c, err = redisx.Connect(short, redisx.Options{Addrs: []string{"127.0.0.1:" + strconv.Itoa(port)}, DialTimeout: 100 * time.Millisecond}, log)
	require.ErrorIs(t, err, context.DeadlineExceeded)
	require.Nil(t, c)
}
