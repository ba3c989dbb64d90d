package limiter

import (
	"context"
	"fmt"
	"hash/fnv"
	"log/slog"
	"net/netip"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

func principal(t testing.TB) events.Principal {
	return events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "lim")}
}

// newTestEngine builds an engine over rules (YAML) with a runtime whose scale and
// override keys are the test's own.
func newTestEngine(t testing.TB, rdb redis.UniversalClient, rules string, opt func(*EngineConfig)) *Engine {
	t.Helper()
	rs, err := ParseRules("test.yaml", []byte(rules))
	require.NoError(t, err)
	rt := NewRuntime(rdb, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	rt.ScalesKey, rt.OverridesKey = redistest.Unique(t, "fg:test:scales"), redistest.Unique(t, "fg:test:overrides")
	rt.ShedKey = redistest.Unique(t, "fg:test:shed")
	c := EngineConfig{Redis: rdb, Rules: NewRuleStore(rs), Runtime: rt, Budget: 2 * time.Second}
	if opt != nil {
		opt(&c)
	}
	e, err := NewEngine(c)
	require.NoError(t, err)
	return e
}

func check(t testing.TB, e *Engine, req Request) Result {
	t.Helper()
	if req.Method == "" {
		req.Method, req.Route = "GET", "/x"
	}
	r, err := e.Check(context.Background(), req)
	require.NoError(t, err)
	return r
}

const oneBucket = `
version: 1
rules:
  - {id: p, tier: principal, limit: 5, period: 1h}
`

func TestEngineAllowsUpToLimitThenDenies(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, oneBucket, nil)
	p := principal(t)
	for i := 4; i >= 0; i-- {
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed)
		require.Equal(t, i, r.Remaining)
		require.Equal(t, 5, r.Limit)
		require.Equal(t, "p", r.Rule)
		require.Equal(t, 1.0, r.Penalty)
		require.Equal(t, 1.0, r.Scale)
	}
	r := check(t, e, Request{Principal: p, Cost: 1})
	require.False(t, r.Allowed)
	require.Equal(t, events.TierPrincipal, r.Tier)
	require.Zero(t, r.Remaining)
	// One token refills every 12 minutes: retry no earlier than that.
	require.InDelta(t, (12 * time.Minute).Seconds(), r.RetryAfter.Seconds(), 1)
	require.WithinDuration(t, time.Now(), r.Now, 5*time.Second, "decision time is Redis time")
}

const grid = `
version: 1
rules:
  - {id: everything, tier: principal, limit: 10, period: 1h}
  - {id: send, tier: endpoint, method: POST, route: "/channels/{channel_id}/messages", limit: 2, period: 1h}
  - {id: per-channel, tier: resource, method: POST, route: "/channels/{channel_id}/messages", resource: channel, limit: 3, period: 1h, algorithm: fixed_window}
`

func TestEngineIsAllOrNothingAcrossTiers(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, grid, nil)
	p := principal(t)
	send := Request{Principal: p, Method: "POST", Route: "/channels/{channel_id}/messages", Resource: "channel:1", Cost: 1}
	for range 2 {
		r := check(t, e, send)
		require.True(t, r.Allowed)
		require.Len(t, r.Tiers, 3, "principal, endpoint and resource tiers all apply")
	}
	// The endpoint tier is empty: denied, and the other tiers must not be charged.
	for range 3 {
		r := check(t, e, send)
		require.False(t, r.Allowed)
		require.Equal(t, events.TierEndpoint, r.Tier)
		require.Equal(t, "send", r.Rule)
	}
	ctx := context.Background()
	tokens, err := rdb.HGet(ctx, redisx.BucketKey(string(p.Kind), p.ID, "everything|tb"), "t").Float64()
	require.NoError(t, err)
	require.InDelta(t, 8, tokens, 0.01, "denied checks consumed principal tokens")
	count, err := rdb.HGet(ctx, redisx.BucketKey(string(p.Kind), p.ID, "per-channel|fw|channel:1"), "c").Int()
	require.NoError(t, err)
	require.Equal(t, 2, count, "denied checks consumed the channel's window")

	// Another route only meets the principal tier.
	r := check(t, e, Request{Principal: p, Method: "GET", Route: "/users/@me", Cost: 1})
	require.True(t, r.Allowed)
	require.Len(t, r.Tiers, 1)
	require.Equal(t, 7, r.Remaining)
}

func TestEngineAppliesPenaltyMultiplier(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 50, period: 1h}\n", nil)
	ctx := context.Background()
	p := principal(t)
	require.NoError(t, rdb.HSet(ctx, redisx.PenaltyKey(string(p.Kind), p.ID), redisx.PenaltyFieldMultiplier, "0.1").Err())
	for range 5 {
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed)
		require.Equal(t, 5, r.Limit)
		require.InDelta(t, 0.1, r.Penalty, 1e-9)
	}
	r := check(t, e, Request{Principal: p, Cost: 1})
	require.False(t, r.Allowed)
	require.Equal(t, events.TierPenalty, r.Tier, "a denial under a penalty is attributed to it")

	// A cost larger than the penalized limit can never fit: denied with a finite retry.
	q := principal(t)
	require.NoError(t, rdb.HSet(ctx, redisx.PenaltyKey(string(q.Kind), q.ID), redisx.PenaltyFieldMultiplier, "0.1").Err())
	r = check(t, e, Request{Principal: q, Cost: 6})
	require.False(t, r.Allowed)
	require.GreaterOrEqual(t, r.RetryAfter, time.Hour)
}

func TestEngineAppliesAdjusterScales(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, grid, nil)
	ctx := context.Background()
	require.NoError(t, rdb.HSet(ctx, e.rt.ScalesKey, "global", "0.5", "route:POST /channels/{channel_id}/messages", "0.5",
		"tier:resource", "2", "bogus", "3").Err())
	require.NoError(t, e.rt.Refresh(ctx))
	p := principal(t)
	require.NoError(t, rdb.HSet(ctx, redisx.PenaltyKey(string(p.Kind), p.ID), redisx.PenaltyFieldMultiplier, "0.5").Err())
	r := check(t, e, Request{Principal: p, Method: "POST", Route: "/channels/{channel_id}/messages", Resource: "channel:9", Cost: 1})
	require.True(t, r.Allowed)
	limits := map[string]int64{}
	for _, tr := range r.Tiers {
		limits[tr.Rule] = tr.Limit
	}
	// rule × scale(global × tier × route) × penalty, floored, at least 1.
	require.Equal(t, map[string]int64{"everything": 2, "send": 1, "per-channel": 1}, limits)

	// The endpoint tier (limit 1 now) denies next; its scale is below 1.
	r = check(t, e, Request{Principal: p, Method: "POST", Route: "/channels/{channel_id}/messages", Resource: "channel:9", Cost: 1})
	require.False(t, r.Allowed)
	require.InDelta(t, 0.25, r.Scale, 1e-9)
}

const quotaRules = `
version: 1
rules:
  - {id: p, tier: principal, limit: 1000, period: 1s}
quotas:
  - {kind: bot, limit: 3}
  - {kind: bot, plan: pro, limit: 5}
`

func TestEngineEnforcesDailyQuota(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, quotaRules, nil)
	ctx := context.Background()
	p := principal(t)
	for i := range 3 {
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed, "request %d", i)
	}
	r := check(t, e, Request{Principal: p, Cost: 1})
	require.False(t, r.Allowed)
	require.Equal(t, events.TierQuota, r.Tier)
	require.Equal(t, "quota-bot-default", r.Rule)
	untilMidnight := r.Now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(r.Now)
	require.Equal(t, untilMidnight, r.RetryAfter, "retry at the 00:00 UTC reset, from Redis time")
	require.Equal(t, untilMidnight, r.ResetAfter)
	key := redisx.DayUsageKey(string(p.Kind), p.ID, r.Now.Format(time.DateOnly))
	used, err := rdb.Get(ctx, key).Int()
	require.NoError(t, err)
	require.Equal(t, 3, used, "denied requests are not counted")
	ttl, err := rdb.PTTL(ctx, key).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, untilMidnight, "usage outlives the day for the quota service")

	// The quota service re-seeds the key from its ledger; the limiter follows it.
	require.NoError(t, rdb.Set(ctx, key, 1, time.Hour).Err())
	require.True(t, check(t, e, Request{Principal: p, Cost: 2}).Allowed)
	require.False(t, check(t, e, Request{Principal: p, Cost: 1}).Allowed)

	// A paid plan has its own quota.
	pro := principal(t)
	for range 5 {
		require.True(t, check(t, e, Request{Principal: pro, Plan: "pro", Cost: 1}).Allowed)
	}
	require.False(t, check(t, e, Request{Principal: pro, Plan: "pro", Cost: 1}).Allowed)
	// Kinds without a quota have none.
	u := events.Principal{Kind: events.PrincipalUser, ID: p.ID}
	for range 10 {
		require.True(t, check(t, e, Request{Principal: u, Cost: 1}).Allowed)
	}
}

const ipRules = `
version: 1
rules:
  - {id: per-ip, tier: ip, kinds: [anonymous], limit: 2, period: 1h}
  - {id: anon, tier: principal, kinds: [anonymous], limit: 100, period: 1h}
  - {id: one, tier: principal, kinds: [user], limit: 1, period: 1h}
  - {id: user-ip, tier: ip, kinds: [user], limit: 100, period: 1h, algorithm: sliding_window}
`

func TestEngineIPTierIsAllOrNothingWithThePrincipal(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, ipRules, nil)
	ctx := context.Background()
	id := redistest.Unique(t, "anon")
	// Each run gets its own /64s: IP buckets are shared by every run on this Redis,
	// and a timestamp's last digits repeat too often to tell runs apart.
	h := fnv.New32a()
	_, _ = h.Write([]byte(id))
	seg := fmt.Sprintf("%x", h.Sum32()&0xffff)
	addr := netip.MustParseAddr("2001:db8:7:" + seg + "::1")
	t.Cleanup(func() {
		for _, net64 := range []string{"2001:db8:7:" + seg, "2001:db8:8:" + seg} {
			keys, _ := rdb.Keys(ctx, "fg:{ip:"+redisx.Escape(net64)+"*").Result()
			if len(keys) > 0 {
				rdb.Del(ctx, keys...)
			}
		}
	})
	anon := func(n string) events.Principal { return events.Principal{Kind: events.PrincipalAnonymous, ID: id + n} }

	t.Run("IP denies: the principal is refunded", func(t *testing.T) {
		require.True(t, check(t, e, Request{Principal: anon("a"), IP: addr, Cost: 1}).Allowed)
		// Same /64, another host: the IPv6 tier counts per /64.
		require.True(t, check(t, e, Request{Principal: anon("b"), IP: addr.Next(), Cost: 1}).Allowed)
		r := check(t, e, Request{Principal: anon("c"), IP: addr, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, events.TierIP, r.Tier)
		tokens, err := rdb.HGet(ctx, redisx.BucketKey("anonymous", id+"c", "anon|tb"), "t").Float64()
		require.NoError(t, err)
		require.InDelta(t, 100, tokens, 0.01, "the principal group committed and was refunded")
		// Another /64 is a different IP bucket.
		other := netip.MustParseAddr("2001:db8:8:" + seg + "::1")
		require.True(t, check(t, e, Request{Principal: anon("c"), IP: other, Cost: 1}).Allowed)
	})

	t.Run("principal denies: the IP is refunded", func(t *testing.T) {
		u := events.Principal{Kind: events.PrincipalUser, ID: id}
		ip := netip.MustParseAddr("198.51.100.77")
		require.True(t, check(t, e, Request{Principal: u, IP: ip, Cost: 1}).Allowed)
		r := check(t, e, Request{Principal: u, IP: ip, Cost: 1})
		require.False(t, r.Allowed)
		require.Equal(t, "one", r.Rule)
		c, err := rdb.HGet(ctx, redisx.BucketKey("ip", ipBucketID(ip), "user-ip|sw"), "c").Int()
		require.NoError(t, err)
		require.Equal(t, 1, c, "only the allowed request counts on the IP")
		_ = rdb.Del(ctx, redisx.BucketKey("ip", ipBucketID(ip), "user-ip|sw"))
	})
}

func TestIPBucketID(t *testing.T) {
	cases := []struct{ in, want string }{
		{"203.0.113.7", "203.0.113.7"},
		{"::ffff:203.0.113.7", "203.0.113.7"},
		{"2001:db8:1:2:3:4:5:6", "2001:db8:1:2::/64"},
		{"2001:db8:1:2::ffff", "2001:db8:1:2::/64"},
	}
	for _, tc := range cases {
		t.Run(tc.in, func(t *testing.T) {
			require.Equal(t, tc.want, ipBucketID(netip.MustParseAddr(tc.in)))
		})
	}
}

func TestEngineRecoversFromScriptFlush(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	for _, tc := range []struct {
		name string
		req  func(p events.Principal) Request
	}{
		{"one group", func(p events.Principal) Request { return Request{Principal: p, Cost: 1} }},
		{"pipelined IP and principal groups", func(p events.Principal) Request {
			return Request{Principal: events.Principal{Kind: events.PrincipalUser, ID: p.ID}, IP: netip.MustParseAddr("192.0.2.44"), Cost: 1}
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			e := newTestEngine(t, rdb, ipRules+"  - {id: b, tier: principal, kinds: [bot], limit: 3, period: 1h}\n", nil)
			require.NoError(t, e.Load(ctx))
			require.NoError(t, rdb.ScriptFlush(ctx).Err())
			r := check(t, e, tc.req(principal(t)))
			require.True(t, r.Allowed, "EVALSHA must fall back to EVAL on NOSCRIPT")
			require.False(t, r.Degraded)
		})
	}
}

func TestEngineKeepsHostileIDsApart(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1, period: 1h}\n", nil)
	base := redistest.Unique(t, "x")
	// "a:b" of kind bot and "b" of kind "bot:a" would share a naive key.
	for _, p := range []events.Principal{
		{Kind: events.PrincipalBot, ID: base + ":a}{b"},
		{Kind: events.PrincipalBot, ID: base + ":a"},
		{Kind: events.PrincipalUser, ID: base + ":a}{b"},
		{Kind: events.PrincipalUser, ID: base + "|p|tb"},
	} {
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed, "%s shares a bucket with another principal", p.Key())
	}
}

func TestEngineShadowRulesNeverDeny(t *testing.T) {
	rdb := redistest.Client(t)
	rules := "version: 1\nrules:\n  - {id: real, tier: principal, limit: 10, period: 1h}\n  - {id: trial, tier: principal, limit: 1, period: 1h, shadow: true, algorithm: gcra}\n"
	t.Run("per rule", func(t *testing.T) {
		e := newTestEngine(t, rdb, rules, nil)
		p := principal(t)
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed)
		require.False(t, r.Shadow)
		for range 3 {
			r = check(t, e, Request{Principal: p, Cost: 1})
			require.True(t, r.Allowed)
			require.True(t, r.Shadow, "the shadow rule would have denied")
			require.Equal(t, "trial", r.ShadowRule)
			require.Equal(t, "real", r.Rule, "the enforcing rule decides")
		}
		require.Equal(t, 6, r.Remaining, "allowed requests still consume the enforcing rule")
	})
	t.Run("globally", func(t *testing.T) {
		e := newTestEngine(t, rdb, rules, func(c *EngineConfig) { c.Shadow = true })
		p := principal(t)
		for range 12 {
			r := check(t, e, Request{Principal: p, Cost: 1})
			require.True(t, r.Allowed)
		}
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Shadow)
		require.Equal(t, "real", r.ShadowRule, "the first rule that would have denied")
	})
}

func TestEngineFlagsNearLimit(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, "version: 1\nnear_limit_ratio: 0.8\nrules:\n  - {id: p, tier: principal, limit: 10, period: 1h, algorithm: fixed_window}\n", nil)
	p := principal(t)
	for i := 1; i <= 10; i++ {
		r := check(t, e, Request{Principal: p, Cost: 1})
		require.True(t, r.Allowed)
		require.Equal(t, i >= 8, r.NearLimit, "request %d", i)
	}
	require.False(t, check(t, e, Request{Principal: p, Cost: 1}).NearLimit, "a denial is not near the limit, it is over")
}

func TestEngineAppliesOverrides(t *testing.T) {
	rdb := redistest.Client(t)
	rules := `
version: 1
rules:
  - {id: free, tier: principal, kinds: [bot], limit: 2, period: 1h}
  - {id: paid, tier: principal, kinds: [bot], plans: [pro], limit: 4, period: 1h}
quotas:
  - {kind: bot, limit: 100}
`
	e := newTestEngine(t, rdb, rules, nil)
	ctx := context.Background()
	vip, pro := principal(t), principal(t)
	require.NoError(t, rdb.HSet(ctx, e.rt.OverridesKey,
		"principal:"+vip.Key(), `{"limits":{"free":5},"quota":3}`,
		"principal:"+pro.Key(), `{"plan":"pro"}`,
		"plan:pro", `{"limits":{"paid":6}}`,
		"principal:not-a-kind:x", `{}`,
		"plan:bad", `{"limits":{"free":"x"}}`,
	).Err())
	require.NoError(t, e.rt.Refresh(ctx), "bad entries are skipped, not fatal")

	r := check(t, e, Request{Principal: vip, Cost: 1})
	require.Equal(t, int64(5), r.Tiers[0].Limit, "principal override of the rule's limit")
	require.Equal(t, int64(3), r.Tiers[1].Limit, "principal override of the quota")
	for range 2 {
		require.True(t, check(t, e, Request{Principal: vip, Cost: 1}).Allowed)
	}
	r = check(t, e, Request{Principal: vip, Cost: 1})
	require.False(t, r.Allowed)
	require.Equal(t, events.TierQuota, r.Tier, "principal override of the quota")

	r = check(t, e, Request{Principal: pro, Cost: 1})
	require.True(t, r.Allowed)
	require.Len(t, r.Tiers, 3, "the override's plan brings the pro rule in")
	for _, tr := range r.Tiers {
		if tr.Rule == "paid" {
			require.Equal(t, int64(6), tr.Limit, "plan override from Redis")
		}
	}
}

func TestNewEngineRequiresRedisAndRules(t *testing.T) {
	_, err := NewEngine(EngineConfig{})
	require.Error(t, err)
}

func TestEngineSkipsRedisWhenNoRuleApplies(t *testing.T) {
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: b, tier: principal, kinds: [bot], limit: 1, period: 1h}\n", nil)
	hook := &countingHook{}
	rdb.AddHook(hook)
	r := check(t, e, Request{Principal: events.Principal{Kind: events.PrincipalUser, ID: "u"}, Cost: 1})
	require.True(t, r.Allowed)
	require.Zero(t, hook.calls.Load())
}

// Concurrent checks share pipelines: every one is answered, and exactly the
// limit is admitted, with batching on and off.
func TestConcurrentChecksSharePipelinesExactly(t *testing.T) {
	rdb := redistest.Client(t)
	for _, batch := range []int{1, 64} {
		t.Run(fmt.Sprintf("batch %d", batch), func(t *testing.T) {
			e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 100, period: 1h}\n  - {id: ip, tier: ip, limit: 1000, period: 1h}\n",
				func(c *EngineConfig) {
					c.RedisBatch = batch
					adm := admission.DefaultConfig() // 300 checks at once: this test is about pipelines, not admission
					adm.Initial, adm.Max = 1024, 1024
					c.admission = &adm
				})
			base := redistest.Unique(t, "pipe")
			var allowed, other atomic.Int64
			var wg sync.WaitGroup
			for i := range 300 {
				wg.Go(func() {
					req := Request{Principal: events.Principal{Kind: events.PrincipalBot, ID: base}, Method: "GET", Route: "/x", Cost: 1,
						IP: netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 7)})}
					if i%3 == 0 { // other principals in the same pipelines
						req.Principal.ID = fmt.Sprintf("%s_%d", base, i)
						r, err := e.Check(context.Background(), req)
						if err == nil && r.Allowed && !r.Degraded {
							other.Add(1)
						}
						return
					}
					r, err := e.Check(context.Background(), req)
					if err == nil && r.Allowed && !r.Degraded {
						allowed.Add(1)
					}
				})
			}
			wg.Wait()
			require.Equal(t, int64(100), allowed.Load(), "200 checks of one principal, limit 100")
			require.Equal(t, int64(100), other.Load(), "100 fresh principals, all allowed")
		})
	}
}
