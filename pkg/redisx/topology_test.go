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

// TestTopologySentinelSwitch: a graceful SENTINEL FAILOVER is the service's
// own event — one "redis master changed" line naming the old and the new
// master, floodgate_redis_master_changes_total and the info series (issue 38).
func TestTopologySentinelSwitch(t *testing.T) {
	if testing.Short() {
		t.Skip("starts Redis and Sentinel processes")
	}
	master := redistest.NewProc(t)
	host, port, _ := strings.Cut(master.Addr, ":")
	replica := redistest.NewProc(t, "--replicaof", host, port)
	rc := replica.Client()
	defer rc.Close()
	ctx := context.Background()
	require.Eventually(t, func() bool {
		info, err := rc.Info(ctx, "replication").Result()
		return err == nil && strings.Contains(info, "master_link_status:up")
	}, 10*time.Second, 20*time.Millisecond, "replica never synced")
	name := "fg" + strings.ReplaceAll(redistest.Unique(t, "t"), "_", "")
	sen := redistest.NewSentinel(t, name, master.Addr, time.Second)

	var logs stacktest.Log
	reg := prometheus.NewRegistry()
	topo := redisx.NewTopology(slog.New(slog.NewJSONHandler(&logs, nil)), reg)
	rdb := redisx.NewClient(redisx.Options{SentinelMaster: name, SentinelAddrs: []string{sen.Addr}, Topology: topo, DialTimeout: time.Second})
	defer rdb.Close()
	require.NoError(t, rdb.Set(ctx, "k", "1", 0).Err())
	require.Equal(t, master.Addr, topo.Master())
	require.Equal(t, master.Addr, rdb.(*redisx.Node).Master())
	require.Contains(t, logs.String(), `"msg":"redis master in use"`)

	sc := redis.NewSentinelClient(&redis.Options{Addr: sen.Addr})
	defer sc.Close()
	require.Eventually(t, func() bool { // NOGOODSLAVE until Sentinel has judged the replica fit
		return sc.Failover(ctx, name).Err() == nil
	}, 20*time.Second, 100*time.Millisecond, "SENTINEL FAILOVER never accepted")
	require.Eventually(t, func() bool {
		_ = rdb.Set(ctx, "k", "2", 0).Err() // READONLY until the client follows
		return topo.Master() == replica.Addr
	}, 20*time.Second, 20*time.Millisecond, "the client never moved to the promoted replica")

	require.Equal(t, 1.0, testutil.ToFloat64(topoCounter(t, reg)))
	out := logs.String()
	require.Contains(t, out, `"msg":"redis master changed"`)
	require.Contains(t, out, `"old_master":"`+master.Addr+`"`)
	require.Contains(t, out, `"new_master":"`+replica.Addr+`"`)
	require.Contains(t, out, `"sentinel_master":"`+name+`"`)
	n, err := testutil.GatherAndCount(reg, "floodgate_redis_master")
	require.NoError(t, err)
	require.Equal(t, 1, n, "one master in use")
}

func topoCounter(t *testing.T, reg *prometheus.Registry) prometheus.Collector {
	t.Helper()
	return gathered{reg: reg, name: "floodgate_redis_master_changes_total"}
}

// gathered sums one metric family of a registry (testutil.ToFloat64 wants one series).
type gathered struct {
	reg  *prometheus.Registry
	name string
}

func (g gathered) Describe(ch chan<- *prometheus.Desc) {
	ch <- prometheus.NewDesc(g.name+"_sum", "sum", nil, nil)
}

func (g gathered) Collect(ch chan<- prometheus.Metric) {
	mfs, _ := g.reg.Gather()
	sum := 0.0
	for _, mf := range mfs {
		if mf.GetName() == g.name {
			for _, m := range mf.GetMetric() {
				sum += m.GetCounter().GetValue()
			}
		}
	}
	ch <- prometheus.MustNewConstMetric(prometheus.NewDesc(g.name+"_sum", "sum", nil, nil), prometheus.GaugeValue, sum)
}

// TestRootCause: a call that failed behind a pool that could not dial names
// the dial's error, not only its own deadline.
func TestRootCause(t *testing.T) {
	p := redistest.NewProc(t)
	addr := p.Addr
	p.Kill()
	rdb := redisx.NewClient(redisx.Options{Addrs: []string{addr}, DialTimeout: 100 * time.Millisecond})
	defer rdb.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 50*time.Millisecond)
	defer cancel()
	err := rdb.Ping(ctx).Err()
	require.Error(t, err)
	cause := rdb.(*redisx.Node).RootCause(context.DeadlineExceeded)
	require.ErrorContains(t, cause, "connection refused")
	require.ErrorContains(t, cause, "the call: context deadline exceeded")
}
