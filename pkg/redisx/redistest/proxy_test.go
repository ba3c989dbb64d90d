package redistest_test

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestProxyTimesRedisApartFromItsDelay: Upstream counts a reply Redis took
// its time over (a BLPOP that waits 50 ms), and not the delay the proxy
// adds to every reply.
func TestProxyTimesRedisApartFromItsDelay(t *testing.T) {
	if testing.Short() {
		t.Skip("needs redis-server")
	}
	redistest.Client(t)
	px := redistest.NewProxy(t, "127.0.0.1:6379")
	rdb := redis.NewClient(&redis.Options{Addr: px.Addr, PoolSize: 1, DisableIdentity: true})
	t.Cleanup(func() { _ = rdb.Close() })
	ctx := context.Background()
	require.NoError(t, rdb.Ping(ctx).Err())
	px.SetDelay(30 * time.Millisecond)
	for range 3 {
		require.NoError(t, rdb.Ping(ctx).Err())
	}
	// PING answers at once: the proxy's 30 ms are not Redis's time. (A
	// loaded machine may still hold a PING past LateBy, never near 30 ms.)
	pings, most := px.Upstream()
	require.Less(t, most, 20*time.Millisecond, "PING answers at once; the proxy's delay is not Redis's time")
	require.ErrorIs(t, rdb.Do(ctx, "BLPOP", redistest.Unique(t, "upstream"), "0.05").Err(), redis.Nil)
	n, most := px.Upstream()
	require.Equal(t, pings+1, n, "the BLPOP is counted")
	require.GreaterOrEqual(t, most, 50*time.Millisecond)
	require.Less(t, most, 500*time.Millisecond)
}
