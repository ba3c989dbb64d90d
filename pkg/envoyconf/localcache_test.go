package envoyconf

import (
	"context"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// countingConf is the configuration of the tests of what is counted.
const countingConf = `domain: l
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 2}
  - key: watched
    shadow_mode: true
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: tight
    rate_limit: {unit: minute, requests_per_unit: 1}
  - key: wide
    rate_limit: {unit: minute, requests_per_unit: 10}
`

// With a LocalCache a counter Redis said is over its limit is answered
// over, nothing remaining, without asking Redis (its count stays) until its
// window ends, as envoy ratelimit's LOCAL_CACHE_SIZE_IN_BYTES does; shadow
// mode still answers OK; a new scale, or the next window, asks Redis again.
func TestEvaluateWithTheLocalCache(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	c := loadYAML(t, countingConf)
	run := redistest.Unique(t, "envoy_lc")
	now := time.Unix(1_800_000_000, 0) // the start of a minute
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 50 * time.Millisecond})
	t.Cleanup(func() { _ = down.Close() })
	lc := NewLocalCache(10)
	ev := &Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + run + ":", LocalCache: lc, Now: func() time.Time { return now }}
	req := Request{Domain: "l", Descriptors: []Descriptor{{Entries: e("user", run)}}}
	key := ev.counterKey("l", e("user", run), []string{run}, now.Unix())
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	call := func() Status {
		t.Helper()
		resp, err := ev.Evaluate(ctx, c, req)
		require.NoError(t, err)
		return resp.Statuses[0]
	}

	for i, want := range []Code{CodeOK, CodeOK, CodeOverLimit} {
		st := call()
		require.Equal(t, want, st.Code, "call %d", i)
		require.False(t, st.Cached, "call %d: Redis answered", i)
	}
	require.Equal(t, 1, lc.Len(), "the over-limit counter is cached")

	now = now.Add(10 * time.Second)
	ev.Redis = down // answered without Redis, or the call fails
	st := call()
	require.Equal(t, CodeOverLimit, st.Code)
	require.True(t, st.Cached)
	require.Equal(t, uint32(0), st.LimitRemaining)
	require.Equal(t, 50*time.Second, st.ResetAfter, "until the window ends")
	require.Equal(t, uint32(2), st.Effective)
	ev.Redis = rdb
	require.Equal(t, "3", rdb.Get(ctx, key).Val(), "the cached hit was not counted")

	// A scale that raises the limit past the count: the entry no longer
	// stands and Redis decides (4 hits of 4).
	req.Scale = func(int, *Limit) float64 { return 2 }
	st = call()
	require.False(t, st.Cached)
	require.Equal(t, CodeOK, st.Code)
	require.Equal(t, "4", rdb.Get(ctx, key).Val())
	req.Scale = nil

	// Shadow mode: cached as over, answered OK.
	req.Descriptors = []Descriptor{{Entries: e("watched", run)}}
	wkey := ev.counterKey("l", e("watched", run), []string{run}, now.Unix()/60*60)
	t.Cleanup(func() { rdb.Del(context.Background(), wkey) })
	call()
	st = call()
	require.True(t, st.Shadowed)
	require.False(t, st.Cached)
	st = call()
	require.True(t, st.Shadowed, "shadow mode answers OK")
	require.Equal(t, CodeOK, st.Code)
	require.True(t, st.Cached)
	require.Equal(t, "2", rdb.Get(ctx, wkey).Val())

	// The next window asks Redis again.
	now = now.Add(time.Minute)
	req.Descriptors = []Descriptor{{Entries: e("user", run)}}
	next := ev.counterKey("l", e("user", run), []string{run}, now.Unix()/60*60)
	t.Cleanup(func() { rdb.Del(context.Background(), next) })
	st = call()
	require.False(t, st.Cached)
	require.Equal(t, CodeOK, st.Code)
	require.Equal(t, uint32(1), st.LimitRemaining)
}

// A full cache keeps its live entries and caches nothing more; ended ones
// are swept out, at most once a second.
func TestLocalCacheIsBounded(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	lc := NewLocalCache(2)
	lc.put("a", 1, now.Add(time.Minute), now)
	lc.put("b", 1, now.Add(time.Second), now)
	lc.put("c", 1, now.Add(time.Minute), now)
	require.False(t, lc.over("c", 1, now), "full: not cached")
	require.True(t, lc.over("a", 1, now))
	later := now.Add(2 * time.Second)
	lc.put("c", 1, later.Add(time.Minute), later)
	require.True(t, lc.over("c", 1, later), "b ended and was swept out")
	require.False(t, lc.over("b", 1, later))
	require.False(t, lc.over("a", 2, later), "another limit: the entry does not stand")
	require.Equal(t, 1, lc.Len(), "and is dropped")
}

// With StopIncrementOverLimit a call that one counter will deny does not
// increment its other counters (envoy ratelimit's
// STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT): the counter over its limit is
// counted, the others answer from their count unchanged; once the denying
// counter is in the LocalCache no counter of the call is incremented.
func TestEvaluateStopsIncrementsWhenOverLimit(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	c := loadYAML(t, countingConf)
	run := redistest.Unique(t, "envoy_stop")
	now := time.Unix(1_800_000_000, 0)
	for _, cache := range []bool{false, true} {
		ev := &Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + run + ":" + strconv.FormatBool(cache) + ":", StopIncrementOverLimit: true,
			Now: func() time.Time { return now }}
		if cache {
			ev.LocalCache = NewLocalCache(10)
		}
		req := Request{Domain: "l", Descriptors: []Descriptor{{Entries: e("tight", run)}, {Entries: e("wide", run)}}}
		tight := ev.counterKey("l", e("tight", run), []string{run}, now.Unix())
		wide := ev.counterKey("l", e("wide", run), []string{run}, now.Unix())
		t.Cleanup(func() { rdb.Del(context.Background(), tight, wide) })
		for i, want := range []Code{CodeOK, CodeOverLimit, CodeOverLimit} {
			resp, err := ev.Evaluate(ctx, c, req)
			require.NoError(t, err)
			require.Equal(t, want, resp.Overall, "cache %v, call %d", cache, i)
			require.Equal(t, uint32(9), resp.Statuses[1].LimitRemaining, "cache %v, call %d: wide counted once", cache, i)
		}
		require.Equal(t, "1", rdb.Get(ctx, wide).Val(), "cache %v: the denied calls did not spend wide's allowance", cache)
		wantTight := "3"
		if cache {
			wantTight = "2" // the third call was answered from the cache
		}
		require.Equal(t, wantTight, rdb.Get(ctx, tight).Val(), "cache %v", cache)
	}

	// Without it every counter counts every hit, as envoy ratelimit's default.
	ev := &Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + run + ":off:", Now: func() time.Time { return now }}
	req := Request{Domain: "l", Descriptors: []Descriptor{{Entries: e("tight", run)}, {Entries: e("wide", run)}}}
	for range 3 {
		_, err := ev.Evaluate(ctx, c, req)
		require.NoError(t, err)
	}
	wide := ev.counterKey("l", e("wide", run), []string{run}, now.Unix())
	t.Cleanup(func() {
		rdb.Del(context.Background(), wide, ev.counterKey("l", e("tight", run), []string{run}, now.Unix()))
	})
	require.Equal(t, "3", rdb.Get(ctx, wide).Val())
}

// ExpirationJitter lengthens each counter's expiry by a random whole number
// of seconds below it (envoy ratelimit's EXPIRATION_JITTER_MAX_SECONDS);
// without it a counter expires one window's length after its last hit.
func TestEvaluateExpirationJitter(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	c := loadYAML(t, countingConf)
	run := redistest.Unique(t, "envoy_jitter")
	now := time.Now()
	clock := func() time.Time { return now }
	ttls := map[time.Duration]bool{}
	for i := range 20 {
		ev := &Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + run + ":" + strconv.Itoa(i) + ":", ExpirationJitter: 300 * time.Second, Now: clock}
		_, err := ev.Evaluate(ctx, c, Request{Domain: "l", Descriptors: []Descriptor{{Entries: e("wide", run)}}})
		require.NoError(t, err)
		key := ev.counterKey("l", e("wide", run), []string{run}, now.Unix()/60*60)
		t.Cleanup(func() { rdb.Del(context.Background(), key) })
		ttl := rdb.TTL(ctx, key).Val()
		require.GreaterOrEqual(t, ttl, 59*time.Second, "a minute, and the jitter")
		require.Less(t, ttl, 360*time.Second)
		ttls[ttl] = true
	}
	require.Greater(t, len(ttls), 5, "the jitter is random: %v", ttls)

	ev := &Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + run + ":none:", Now: clock}
	_, err := ev.Evaluate(ctx, c, Request{Domain: "l", Descriptors: []Descriptor{{Entries: e("wide", run)}}})
	require.NoError(t, err)
	key := ev.counterKey("l", e("wide", run), []string{run}, now.Unix()/60*60)
	t.Cleanup(func() { rdb.Del(context.Background(), key) })
	require.LessOrEqual(t, rdb.TTL(ctx, key).Val(), 60*time.Second)
}
