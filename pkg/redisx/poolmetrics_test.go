package redisx_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestPoolCollectorCountsHitsMissesAndConnections: commands that find an
// idle connection are hits, those that find none misses, and the open
// connections show as idle once they are done.
func TestPoolCollectorCountsHitsMissesAndConnections(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	redistest.Client(t)
	rdb := redisx.NewClient(redisx.Options{Addrs: []string{"127.0.0.1:6379"}, PoolSize: 8})
	t.Cleanup(func() { _ = rdb.Close() })
	reg := prometheus.NewRegistry()
	reg.MustRegister(redisx.PoolCollector(rdb))
	read := func() map[string]float64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		m := map[string]float64{}
		for _, mf := range mfs {
			for _, s := range mf.GetMetric() {
				name := mf.GetName()
				for _, l := range s.GetLabel() {
					name += "/" + l.GetValue()
				}
				m[name] = s.GetCounter().GetValue() + s.GetGauge().GetValue()
			}
		}
		return m
	}
	require.NoError(t, rdb.Ping(context.Background()).Err()) // one miss: the pool was empty
	require.NoError(t, rdb.Ping(context.Background()).Err()) // one hit
	// Four commands at once: one takes the idle connection, three find none.
	key := redistest.Unique(t, "pool")
	var wg sync.WaitGroup
	for range 4 {
		wg.Go(func() { require.NoError(t, rdb.Do(context.Background(), "BLPOP", key, "5").Err()) })
	}
	require.Eventually(t, func() bool {
		s := rdb.PoolStats()
		return s.TotalConns == 4 && s.IdleConns == 0
	}, 5*time.Second, 5*time.Millisecond, "four connections in use")
	require.NoError(t, redistest.Client(t).RPush(context.Background(), key, 1, 2, 3, 4).Err())
	wg.Wait()
	m := read()
	require.Equal(t, 2.0, m["floodgate_redis_pool_hits_total"], "%v", m)
	require.Equal(t, 4.0, m["floodgate_redis_pool_misses_total"], "%v", m)
	require.Equal(t, 4.0, m["floodgate_redis_pool_connections/idle"], "%v", m)
	require.Equal(t, 0.0, m["floodgate_redis_pool_connections/in_use"], "%v", m)
	require.Equal(t, 0.0, m["floodgate_redis_pool_timeouts_total"], "%v", m)
}

// TestIdleConnectionsAreReused: a command takes an idle connection when
// there is one — go-redis's pool checks an idle connection's socket first,
// and a wrapper that misreported it made every idle connection stale, so a
// Sentinel client dialed a new connection for nearly every command (issue 38).
func TestIdleConnectionsAreReused(t *testing.T) {
	if testing.Short() {
		t.Skip("starts redis-server and a sentinel")
	}
	master := redistest.NewProc(t)
	name := "fg" + strings.ReplaceAll(redistest.Unique(t, "reuse"), "_", "")
	sen := redistest.NewSentinel(t, name, master.Addr, 5*time.Second)
	for _, tc := range []struct {
		name string
		o    redisx.Options
	}{
		{"standalone", redisx.Options{Addrs: []string{master.Addr}}},
		{"sentinel", redisx.Options{SentinelMaster: name, SentinelAddrs: []string{sen.Addr}}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			tc.o.DialTimeout, tc.o.PoolSize, tc.o.MinIdleConns = time.Second, 4, 2
			rdb := redisx.NewClient(tc.o)
			t.Cleanup(func() { _ = rdb.Close() })
			ctx := context.Background()
			for range 200 {
				require.NoError(t, rdb.Incr(ctx, "reuse").Err())
			}
			st := rdb.PoolStats()
			require.Zero(t, st.StaleConns, "no idle connection taken for dead")
			require.GreaterOrEqual(t, st.Hits, uint32(190), "commands found an idle connection")
			require.LessOrEqual(t, st.TotalConns, uint32(4))
		})
	}
}
