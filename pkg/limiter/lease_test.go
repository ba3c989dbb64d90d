package limiter

import (
	"context"
	"fmt"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// leasingEngine is an engine whose one rule (100 a second) leases 10 units,
// each check its own Redis call counted by the hook, and a user of its own.
func leasingEngine(t *testing.T, name string) (*Engine, *scriptHook, events.Principal) {
	t.Helper()
	rdb := redistest.Client(t)
	e := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 100, lease: 10, period: 1s}\n", func(c *EngineConfig) { c.RedisBatch = 1 })
	hook := &scriptHook{}
	rdb.AddHook(hook)
	return e, hook, events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, name)}
}

// A leasing rule is answered from the instance's lease while it has units. A
// key's first check on an instance goes to Redis exactly (a key checked once
// leases nothing); the second, within a second, takes 10 units, and the
// next 9 checks cost no Redis call.
func TestLeaseAnswersWithoutRedis(t *testing.T) {
	e, hook, u := leasingEngine(t, "lease")
	for i := range 11 {
		r := check(t, e, Request{Principal: u, Cost: 1})
		require.True(t, r.Allowed, "check %d", i)
		require.Len(t, r.Tiers, 1)
		require.Equal(t, int64(100), r.Tiers[0].Limit)
	}
	require.Equal(t, int64(2), hook.calls.Load(), "an exact first call, then one that leased the next nine")
	require.InDelta(t, 9, testutil.ToFloat64(e.m.leaseHits), 0)
	r := check(t, e, Request{Principal: u, Cost: 1})
	require.True(t, r.Allowed)
	require.Equal(t, int64(3), hook.calls.Load(), "an empty lease goes back to Redis")
}

// Units are conserved: what one instance leased and did not spend goes back
// to Redis when the lease ends, where an exact instance on the same bucket
// can spend it. A bucket of 10 (refilling 10 an hour) admits 10 in all.
func TestLeaseGivesUnusedUnitsBack(t *testing.T) {
	rdb := redistest.Client(t)
	rules := "version: 1\nrules:\n  - {id: p, tier: principal, limit: 10, lease: %d, period: 1h}\n"
	leasing := newTestEngine(t, rdb, fmt.Sprintf(rules, 10), nil)
	exact := newTestEngine(t, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 10, period: 1h}\n", nil)
	u := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "giveback")}
	require.True(t, check(t, leasing, Request{Principal: u, Cost: 1}).Allowed, "exact: the key's first check here")
	require.True(t, check(t, leasing, Request{Principal: u, Cost: 1}).Allowed, "leases the 9 left, spends 1")
	require.False(t, check(t, exact, Request{Principal: u, Cost: 1}).Allowed, "the other 8 are leased")

	// End the lease as a new scale does (it binds the rule differently), and
	// give its 8 units back; the exact instance then admits them.
	key := ""
	for i := range leasing.leases.shards {
		for k := range leasing.leases.shards[i].m {
			if leasing.leases.shards[i].m[k].units > 0 {
				key = k
			}
		}
	}
	require.NotEmpty(t, key)
	s := leasing.leases.shard(key)
	s.mu.Lock()
	le := s.m[key]
	delete(s.m, key)
	s.mu.Unlock()
	require.Equal(t, int64(8), le.units)
	leasing.giveBack(le)
	require.Eventually(t, func() bool { return testutil.ToFloat64(leasing.m.refunds.WithLabelValues("ok")) == 1 }, 5*time.Second, 10*time.Millisecond)
	admitted := 0
	for range 20 {
		if check(t, exact, Request{Principal: u, Cost: 1}).Allowed {
			admitted++
		}
	}
	require.Equal(t, 8, admitted, "the leased units went back")
}

// The over-admission bound with several instances on one Redis: a key hammered
// past its limit is admitted at most capacity + rate × T + instances × lease
// over T; a key under its limit is never denied and mostly answered from
// leases, without Redis.
func TestLeaseBoundAcrossInstances(t *testing.T) {
	rdb := redistest.Client(t)
	const instances, limit, lease = 4, 50, 10
	rules := fmt.Sprintf("version: 1\nrules:\n  - {id: p, tier: principal, limit: %d, lease: %d, period: 1s}\n", limit, lease)
	engines := make([]*Engine, instances)
	for i := range engines {
		engines[i] = newTestEngine(t, rdb, rules, nil)
	}
	// run has callers per instance check one key every pause for d.
	run := func(key string, callers int, pause, d time.Duration) (checks, admitted int64, elapsed time.Duration) {
		u := events.Principal{Kind: events.PrincipalBot, ID: key}
		var c, a atomic.Int64
		ctx, cancel := context.WithTimeout(context.Background(), d)
		defer cancel()
		start := time.Now()
		var wg sync.WaitGroup
		for _, e := range engines {
			for range callers {
				wg.Go(func() {
					for ctx.Err() == nil {
						r, err := e.Check(context.Background(), Request{Principal: u, Method: "GET", Route: "/x", Cost: 1})
						if err != nil {
							t.Error(err)
							return
						}
						c.Add(1)
						if r.Allowed {
							a.Add(1)
						}
						time.Sleep(pause)
					}
				})
			}
		}
		wg.Wait()
		return c.Load(), a.Load(), time.Since(start)
	}
	hits := func() (n float64) {
		for _, e := range engines {
			n += testutil.ToFloat64(e.m.leaseHits)
		}
		return n
	}

	t.Run("past its limit", func(t *testing.T) {
		checks, admitted, elapsed := run(redistest.Unique(t, "hammered"), 8, 500*time.Microsecond, 2*time.Second)
		exact := limit + limit*elapsed.Seconds() // capacity + rate × T
		bound := exact + instances*lease
		t.Logf("%d checks, %d admitted in %s: exact %.0f, bound %.0f", checks, admitted, elapsed.Round(time.Millisecond), exact, bound)
		require.LessOrEqual(t, float64(admitted), bound, "capacity + rate × T + instances × lease")
		require.GreaterOrEqual(t, float64(admitted), 0.8*exact, "leases do not starve the key")
	})
	t.Run("under its limit", func(t *testing.T) {
		before := hits()
		checks, admitted, elapsed := run(redistest.Unique(t, "steady"), 1, 100*time.Millisecond, 2*time.Second) // ≈40/s of 50/s
		leased := hits() - before
		t.Logf("%d checks, %d admitted in %s; %.0f from leases", checks, admitted, elapsed.Round(time.Millisecond), leased)
		require.Equal(t, checks, admitted, "a key under its limit is never denied")
		require.GreaterOrEqual(t, leased, 0.7*float64(checks), "most checks never reach Redis")
	})
}

// scriptHook counts the check script's calls (EVALSHA/EVAL, alone or in a
// pipeline), not the runtime's polling on the same client.
type scriptHook struct{ calls atomic.Int64 }

func (h *scriptHook) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *scriptHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if n := cmd.Name(); n == "evalsha" || n == "eval" {
			h.calls.Add(1)
		}
		return next(ctx, cmd)
	}
}

func (h *scriptHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		for _, c := range cmds {
			if n := c.Name(); n == "evalsha" || n == "eval" {
				h.calls.Add(1)
			}
		}
		return next(ctx, cmds)
	}
}

// A key checked about once a second on an instance leases nothing: each
// check goes to Redis exactly, with no units taken to expire and come back.
func TestLeaseSparseKeyLeasesNothing(t *testing.T) {
	e, hook, u := leasingEngine(t, "sparse")
	for i := range 3 {
		if i > 0 {
			time.Sleep(leaseLife + 100*time.Millisecond)
		}
		r := check(t, e, Request{Principal: u, Cost: 1})
		require.True(t, r.Allowed)
		require.Equal(t, int64(99), r.Tiers[0].Remaining, "check %d took one unit, not a lease", i)
	}
	require.Equal(t, int64(3), hook.calls.Load())
	require.Zero(t, testutil.ToFloat64(e.m.leaseHits))
	require.Zero(t, testutil.ToFloat64(e.m.leaseReturned), "nothing leased, nothing given back")
}
