package limiter

import (
	"context"
	"net/netip"
	"os"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// clusterClient connects to the local 3-master Redis Cluster
// (FLOODGATE_REDIS_CLUSTER_ADDRS) and fails loudly when it is not there.
func clusterClient(t *testing.T) redis.UniversalClient {
	if testing.Short() {
		t.Skip("needs the local Redis Cluster: `make test` runs it")
	}
	addrs := config.NewEnv(os.Getenv).List("FLOODGATE_REDIS_CLUSTER_ADDRS", "127.0.0.1:7000,127.0.0.1:7001,127.0.0.1:7002")
	c := redisx.NewClient(redisx.Options{Addrs: addrs, DialTimeout: time.Second})
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	defer cancel()
	_, isCluster := c.(*redis.ClusterClient)
	require.True(t, isCluster, "several addresses make a cluster client")
	require.NoError(t, redisx.Ping(ctx, c), "the Redis Cluster at %v must be running (make up)", addrs)
	return c
}

func TestEngineOnRedisCluster(t *testing.T) {
	rdb := clusterClient(t)
	ctx := context.Background()
	rules := grid + `  - {id: per-ip, tier: ip, limit: 3, period: 1h}
quotas:
  - {kind: bot, limit: 1000}
`
	e := newTestEngine(t, rdb, rules, nil)
	require.NoError(t, e.Load(ctx), "the script is loaded on every master")

	base := redistest.Unique(t, "cl")
	// Hostile ids: braces that would open another hash tag, separators, a
	// would-be IPv6 literal. Each principal's keys must stay on one slot (or
	// the cluster answers CROSSSLOT) and apart from every other principal's.
	ids := []string{base, base + "}{x", base + "{a}", base + ":tb:x", base + "2001:db8::1"}
	slots := map[int64]bool{}
	for i, id := range ids {
		p := events.Principal{Kind: events.PrincipalBot, ID: id}
		n := time.Now().UnixNano() // a fresh /64 per run: IP buckets outlive the test
		ip := netip.AddrFrom16([16]byte{0x20, 0x01, 0x0d, 0xb8, byte(n >> 40), byte(n >> 32), byte(n >> 24), byte(n >> 16), byte(n >> 8), byte(n), 0, 0, 0, 0, 0, byte(i)})
		send := Request{Principal: p, IP: ip, Method: "POST", Route: "/channels/{channel_id}/messages", Resource: "channel:{1}", Cost: 1}
		for range 2 {
			r := check(t, e, send)
			require.True(t, r.Allowed, "%q", id)
			require.False(t, r.Degraded, "%q: %s", id, r.Error)
			require.Len(t, r.Tiers, 5, "principal, endpoint, resource, quota and IP tiers")
		}
		r := check(t, e, send)
		require.False(t, r.Allowed, "%q: the endpoint tier allows 2", id)
		require.Equal(t, "send", r.Rule)

		slot, err := rdb.ClusterKeySlot(ctx, redisx.BucketKey("bot", id, "everything|tb")).Result()
		require.NoError(t, err)
		for _, k := range []string{redisx.PenaltyKey("bot", id), redisx.DayUsageKey("bot", id, r.Now.Format(time.DateOnly)),
			redisx.BucketKey("bot", id, "per-channel|fw|channel:{1}")} {
			s, err := rdb.ClusterKeySlot(ctx, k).Result()
			require.NoError(t, err)
			require.Equal(t, slot, s, "%q: %s left the principal's slot", id, k)
		}
		slots[slot] = true
		used, err := rdb.Get(ctx, redisx.DayUsageKey("bot", id, r.Now.Format(time.DateOnly))).Int()
		require.NoError(t, err)
		require.Equal(t, 2, used, "%q: day usage counts allowed requests only", id)
		// The IP tier (another slot) was refunded for the denied request.
		c, err := rdb.HGet(ctx, redisx.BucketKey("ip", ipBucketID(ip), "per-ip|tb"), "t").Float64()
		require.NoError(t, err)
		require.InDelta(t, 1, c, 0.01, "%q: IP tokens", id)
	}
	require.Greater(t, len(slots), 1, "principals spread over slots")

	// The penalty is read on the principal's slot, whatever node holds it.
	p := events.Principal{Kind: events.PrincipalBot, ID: base + "}pen{"}
	require.NoError(t, rdb.HSet(ctx, redisx.PenaltyKey("bot", p.ID), redisx.PenaltyFieldMultiplier, "0.5").Err())
	r := check(t, e, Request{Principal: p, Method: "GET", Route: "/x", Cost: 1})
	require.InDelta(t, 0.5, r.Penalty, 1e-9)
	require.Equal(t, int64(5), r.Tiers[0].Limit)
}
