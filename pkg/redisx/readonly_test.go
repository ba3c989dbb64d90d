package redisx_test

import (
	"context"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestTopologyReadOnlySwitch: the master a Sentinel client writes to is
// demoted without the client hearing of it (no +switch-master: here the
// sentinel is re-pointed with SENTINEL REMOVE and MONITOR; in production a
// lost connection to the sentinels). Its writes are refused with READONLY;
// Reconnect (what the limiter does on READONLY) retires the connections, the
// next dial asks Sentinel, reaches the new master, and the switch is logged
// and counted via "readonly".
func TestTopologyReadOnlySwitch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis and Sentinel processes")
	}
	ctx := context.Background()
	oldMaster := redistest.NewProc(t)
	newMaster := redistest.NewProc(t)
	name := "fg" + strings.ReplaceAll(redistest.Unique(t, "ro"), "_", "")
	sen := redistest.NewSentinel(t, name, oldMaster.Addr, time.Minute) // never judges by itself here

	var logs stacktest.Log
	reg := prometheus.NewRegistry()
	topo := redisx.NewTopology(slog.New(slog.NewJSONHandler(&logs, nil)), reg)
	rdb := redisx.NewClient(redisx.Options{SentinelMaster: name, SentinelAddrs: []string{sen.Addr}, Topology: topo,
		DialTimeout: time.Second, PoolSize: 4, MinIdleConns: 2})
	defer rdb.Close()
	node := rdb.(*redisx.Node)
	require.NoError(t, rdb.Set(ctx, "k", "1", 0).Err())
	require.Equal(t, oldMaster.Addr, node.Master())

	// The switch, by hand: the old master a replica of the new one (it drops
	// its clients; the client dials again and Sentinel still names it), then
	// the sentinel naming the new one.
	oc, nc := oldMaster.Client(), newMaster.Client()
	defer oc.Close()
	defer nc.Close()
	host, port, _ := strings.Cut(newMaster.Addr, ":")
	require.NoError(t, oc.Do(ctx, "REPLICAOF", host, port).Err())
	err := rdb.Set(ctx, "k", "2", 0).Err()
	require.True(t, redisx.IsReadOnly(err), "the demoted master refuses the write: %v", err)
	sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr})
	defer sc.Close()
	require.NoError(t, sc.Remove(ctx, name).Err())
	require.NoError(t, sc.Monitor(ctx, name, host, port, "1").Err())
	require.Equal(t, oldMaster.Addr, node.Master(), "not moved before Reconnect")

	node.Reconnect()
	require.NoError(t, rdb.Set(ctx, "k", "3", 0).Err())
	require.Equal(t, newMaster.Addr, node.Master())
	require.Equal(t, "3", nc.Get(ctx, "k").Val(), "written to the new master")

	require.Equal(t, 1.0, testutil.ToFloat64(topoCounter(t, reg)))
	n, err := testutil.GatherAndCount(reg, "floodgate_redis_master_changes_total")
	require.NoError(t, err)
	require.Equal(t, 1, n, "one series: via readonly")
	require.Contains(t, logs.String(), `"via":"readonly"`)
	require.Contains(t, logs.String(), `"old_master":"`+oldMaster.Addr+`"`)
	require.Contains(t, logs.String(), `"new_master":"`+newMaster.Addr+`"`)
}
