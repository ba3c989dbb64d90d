package redisx_test

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestClusterCallsNameTheDeadNode: with one master of a Redis Cluster dead,
// a call to its slots that fails on its deadline or a closed connection
// names the dial's error too ("connection refused"), as a single node's
// RootCause does — the cause a shard's breaker records; calls to the other
// masters are untouched, and Redis's own replies are not rewritten.
func TestClusterCallsNameTheDeadNode(t *testing.T) {
	if testing.Short() {
		t.Skip("starts a Redis Cluster")
	}
	cl := redistest.NewCluster(t, 3, 0, 2*time.Second)
	rdb := redisx.NewClient(redisx.Options{Addrs: cl.Addrs(), DialTimeout: 200 * time.Millisecond})
	t.Cleanup(func() { _ = rdb.Close() })
	cc := rdb.(*redis.ClusterClient)
	ctx := context.Background()
	dead := cl.Nodes[0]
	var onDead, onLive string
	for i := 0; onDead == "" || onLive == ""; i++ {
		k := "cause" + strconv.Itoa(i)
		m, err := cc.MasterForKey(ctx, k)
		require.NoError(t, err)
		if m.Options().Addr == dead.Addr {
			onDead = cmpOr(onDead, k)
		} else {
			onLive = cmpOr(onLive, k)
		}
	}
	require.NoError(t, rdb.Set(ctx, onDead, 1, 0).Err())
	require.ErrorIs(t, rdb.Get(ctx, "cause-none"+onDead).Err(), redis.Nil, "a nil reply is no failure")

	dead.Kill()
	var failed int
	for i := range 20 {
		cctx, cancel := context.WithTimeout(ctx, 50*time.Millisecond)
		err := rdb.Incr(cctx, onDead).Err()
		cancel()
		if err != nil {
			failed++
			require.ErrorContains(t, err, "connection refused", "call %d: the dead master's calls name the dial's error", i)
		}
		require.NoError(t, rdb.Incr(ctx, onLive).Err(), "another master's calls go through")
	}
	require.Equal(t, 20, failed)
	_, err := rdb.Do(ctx, "NOSUCHCOMMAND", onLive).Result()
	require.ErrorContains(t, err, "unknown command")
	require.NotContains(t, err.Error(), "connection refused", "a reply from a live node is its own")
}

func cmpOr(s, def string) string {
	if s != "" {
		return s
	}
	return def
}
