package redisx

import (
	"bytes"
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
)

// A Cluster's slot-map change: a replica promoted in place of a dead master.
func TestTopologyClusterSlotMap(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	topo := NewTopology(slog.New(slog.NewJSONHandler(&logs, nil)), reg)
	ctx := context.Background()
	slots := func(a, b string) []redis.ClusterSlot {
		return []redis.ClusterSlot{{Start: 0, End: 8191, Nodes: []redis.ClusterNode{{Addr: a}}}, {Start: 8192, End: 16383, Nodes: []redis.ClusterNode{{Addr: b}}}}
	}
	topo.slots(ctx, slots("10.0.0.1:7000", "10.0.0.2:7000"))
	topo.slots(ctx, slots("10.0.0.1:7000", "10.0.0.2:7000"))
	require.Zero(t, testutil.ToFloat64(topo.changes.WithLabelValues(ViaClusterSlot)), "the first map and an unchanged one are no change")
	require.Equal(t, "10.0.0.1:7000,10.0.0.2:7000", topo.Master())

	topo.slots(ctx, slots("10.0.0.1:7000", "10.0.0.3:7000"))
	require.Equal(t, 1.0, testutil.ToFloat64(topo.changes.WithLabelValues(ViaClusterSlot)))
	require.Equal(t, "10.0.0.1:7000,10.0.0.3:7000", topo.Master())
	require.Contains(t, logs.String(), `"msg":"redis cluster slot map changed"`)
	require.Contains(t, logs.String(), `"moved":["8192-16383: 10.0.0.2:7000 → 10.0.0.3:7000"]`)
	n, err := testutil.GatherAndCount(reg, "floodgate_redis_master")
	require.NoError(t, err)
	require.Equal(t, 2, n, "the dead master's series is gone")
}

// A dial that asked Sentinel before the switch and reached the old master
// after a later dial had reached the new one is stale: refused, not logged
// as a switch back.
func TestTopologyStaleDial(t *testing.T) {
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	topo := NewTopology(slog.New(slog.NewJSONHandler(&logs, nil)), reg)
	ctx := context.Background()
	require.True(t, topo.dialed(ctx, "old:1", ViaSentinel, 1))
	require.True(t, topo.dialed(ctx, "new:1", ViaSentinel, 3))
	require.False(t, topo.dialed(ctx, "old:1", ViaSentinel, 2), "started before the dial that found the new master")
	require.Equal(t, "new:1", topo.Master())
	require.True(t, topo.dialed(ctx, "new:1", ViaSentinel, 2), "the master in use, whenever dialed")
	require.True(t, topo.dialed(ctx, "old:1", ViaSentinel, 4), "a switch back, learned by a later dial")
	require.Equal(t, 2.0, testutil.ToFloat64(topo.changes.WithLabelValues(ViaSentinel)))
	require.Equal(t, 2, bytes.Count(logs.Bytes(), []byte(`"msg":"redis master changed"`)))
}
