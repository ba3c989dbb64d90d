package envoyconf

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// loadYAML loads one configuration file.
func loadYAML(t *testing.T, yaml string) *Config {
	t.Helper()
	c, err := Load([]File{{Name: "t.yaml", Data: []byte(yaml)}}, Options{})
	require.NoError(t, err)
	return c
}

func TestRouteJoin(t *testing.T) {
	long := strings.Repeat("k", 200)
	cases := []struct {
		name, route, segment, want string
	}{
		{"first segment", "", "edge_proxy", "/edge_proxy"},
		{"pchar stays, the rest is percent-encoded", "/d", "path_/files/*.pdf {x}%", "/d/path_%2Ffiles%2F*.pdf%20%7Bx%7D%25"},
		{"non-ASCII bytes are encoded", "/d", "key_é", "/d/key_%C3%A9"},
		{"an empty segment adds nothing", "/d", "", "/d"},
		{"an empty first segment is the root", "", "", "/"},
		{"a segment that would pass the bound is dropped", "/" + long, strings.Repeat("v", 60), "/" + long},
		{"a first segment past the bound is cut", "", strings.Repeat("é", 100), "/" + strings.Repeat("%C3%A9", 42) + "%C3"},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			got := RouteJoin(c.route, c.segment)
			require.Equal(t, c.want, got)
			require.LessOrEqual(t, len(got), events.MaxRouteLen)
			require.NoError(t, events.ValidRoute(got), "a decision.v1 route")
		})
	}
}

// FuzzRouteJoin: whatever a configuration holds, its routes are decision.v1 routes.
func FuzzRouteJoin(f *testing.F) {
	f.Add("edge", "user", "path_/a/{b}")
	f.Add("", "\x00", "%")
	f.Fuzz(func(t *testing.T, domain, a, b string) {
		r := RouteJoin(RouteJoin(RouteJoin("", domain), a), b)
		if err := events.ValidRoute(r); err != nil {
			t.Fatalf("%q %q %q: route %q: %v", domain, a, b, r, err)
		}
	})
}

func TestLoadedLimitsCarryTheirRoute(t *testing.T) {
	c := mustLoad(t)
	m := c.Lookup("example", e("key", "value", "subkey", "s"))
	require.NotNil(t, m.Limit)
	require.Equal(t, "/example/key_value/subkey", m.Limit.Route)
	m = c.Lookup("example", e("path", "/files/a.pdf"))
	require.NotNil(t, m.Limit)
	require.Equal(t, "/example/path_%2Ffiles%2F*", m.Limit.Route, "the configured wildcard, never the call's value")
}

func TestEffective(t *testing.T) {
	require.Equal(t, uint32(100), Effective(100, 1))
	require.Equal(t, uint32(50), Effective(100, 0.5))
	require.Equal(t, uint32(1), Effective(3, 0.1), "at least 1")
	require.Equal(t, uint32(0), Effective(0, 0.5), "a zero limit stays zero")
	require.Equal(t, uint32(30), Effective(10, 3))
	require.Equal(t, uint32(7), Effective(10, 0.7), "floor(7 - ε) is 7, as the check script computes it")
	require.Equal(t, uint32(4294967295), Effective(4294967295, 10), "bounded by what Envoy can carry")
}

// The principal's penalty (read in the counters' pipeline) and a scale
// multiply the limits of the descriptors they apply to; the others keep
// envoy ratelimit's.
func TestEvaluatePenaltyAndScale(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	c := loadYAML(t, `domain: p
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: shared
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
	run := redistest.Unique(t, "envoy_pen")
	ev := &Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + run + ":", Now: func() time.Time { return time.Unix(1_800_000_000, 0) }}
	penKey := redisx.PenaltyKey("user", run)
	require.NoError(t, rdb.HSet(ctx, penKey, "m", "0.3").Err())
	require.NoError(t, rdb.Expire(ctx, penKey, time.Minute).Err())
	t.Cleanup(func() { rdb.Del(context.Background(), penKey) })

	req := Request{Domain: "p", PenaltyKey: penKey, Descriptors: []Descriptor{
		{Entries: e("user", run), Penalize: true},
		{Entries: e("shared", run)},
	}}
	var resp Response
	var err error
	for range 4 {
		resp, err = ev.Evaluate(ctx, c, req)
		require.NoError(t, err)
	}
	pen, shared := resp.Statuses[0], resp.Statuses[1]
	require.Equal(t, 0.3, resp.Penalty)
	require.Equal(t, uint32(3), pen.Effective, "10 × 0.3")
	require.Equal(t, CodeOverLimit, pen.Code, "the fourth hit of three")
	require.Equal(t, uint32(10), pen.Configured())
	rpu, _, _ := pen.RequestsPerUnit()
	require.Equal(t, uint32(3), rpu, "Envoy is told the limit enforced")
	require.Equal(t, uint32(10), shared.Effective)
	require.Equal(t, CodeOK, shared.Code)
	require.Equal(t, uint32(6), shared.LimitRemaining)
	require.Equal(t, CodeOverLimit, resp.Overall)

	// A scale on the shared descriptor only.
	req.Scale = func(i int, l *Limit) float64 {
		if l.Route == "/p/shared" {
			return 0.5
		}
		return 0
	}
	req.PenaltyKey, req.Descriptors[0].Penalize = "", false
	resp, err = ev.Evaluate(ctx, c, req)
	require.NoError(t, err)
	require.Equal(t, 1.0, resp.Penalty, "not read")
	require.Equal(t, uint32(10), resp.Statuses[0].Effective, "neither penalized nor scaled: the configured limit")
	require.Equal(t, uint32(5), resp.Statuses[1].Effective)
	require.Equal(t, 0.5, resp.Statuses[1].Scale)
	require.Equal(t, CodeOK, resp.Statuses[1].Code, "5 hits of 5")
	require.Equal(t, uint32(0), resp.Statuses[1].LimitRemaining)
}

// In envoy ratelimit's keys the counters are the ones envoy ratelimit
// itself counts in — its CacheKeyGenerator's bytes, share_threshold's
// pattern in place of the value — so a count it left is continued; the
// state of Floodgate's own algorithms stays under Prefix.
func TestEvaluateInEnvoyRatelimitsKeys(t *testing.T) {
	rdb := redistest.Client(t)
	ctx := context.Background()
	c := loadYAML(t, `domain: k
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
    descriptors:
      - key: path
        rate_limit: {unit: hour, requests_per_unit: 5}
  - key: bucket
    value: shared-*
    share_threshold: true
    rate_limit: {unit: second, requests_per_unit: 3}
  # floodgate: {algorithm: gcra}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 2}
`)
	run := redistest.Unique(t, "envoy_keys")
	now := time.Unix(1_800_000_042, 0)
	prefix := "ratelimit_" + run + "_"
	ev := &Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + run + ":", EnvoyRatelimitKeys: true, EnvoyRatelimitPrefix: prefix,
		Now: func() time.Time { return now }}

	minute := prefix + "k_user_" + run + "_1800000000"
	hour := prefix + "k_user_" + run + "_path_/a_b_1800000000"
	shared := prefix + "k_bucket_shared-*_1800000042"
	t.Cleanup(func() { rdb.Del(context.Background(), minute, hour, shared) })
	// envoy ratelimit counted 9 of the minute's 10 before this instance took over.
	require.NoError(t, rdb.Set(ctx, minute, 9, time.Minute).Err())

	resp, err := ev.Evaluate(ctx, c, Request{Domain: "k", Descriptors: []Descriptor{
		{Entries: e("user", run)}, {Entries: e("user", run, "path", "/a_b")}, {Entries: e("bucket", "shared-x")}}})
	require.NoError(t, err)
	require.Equal(t, CodeOK, resp.Statuses[0].Code)
	require.Equal(t, uint32(0), resp.Statuses[0].LimitRemaining, "the tenth hit of the minute, counted on from envoy ratelimit's 9")
	require.Equal(t, uint32(4), resp.Statuses[1].LimitRemaining)
	require.Equal(t, uint32(2), resp.Statuses[2].LimitRemaining)
	for key, want := range map[string]string{minute: "10", hour: "1", shared: "1"} {
		got, err := rdb.Get(ctx, key).Result()
		require.NoError(t, err, "envoy ratelimit's key %q", key)
		require.Equal(t, want, got, key)
	}
	ttl, err := rdb.TTL(ctx, hour).Result()
	require.NoError(t, err)
	require.Equal(t, time.Hour, ttl.Round(time.Second), "EXPIRE of the unit, as envoy ratelimit without jitter")

	resp, err = ev.Evaluate(ctx, c, Request{Domain: "k", Descriptors: []Descriptor{{Entries: e("user", run)}, {Entries: e("bucket", "shared-y")}}})
	require.NoError(t, err)
	require.Equal(t, CodeOverLimit, resp.Statuses[0].Code, "the eleventh")
	require.Equal(t, uint32(1), resp.Statuses[1].LimitRemaining, "another value, the same shared counter")

	// Floodgate's algorithms have no counter in envoy ratelimit: their
	// state keeps Floodgate's format under Prefix.
	var alg keyRecorder
	ev.Algorithms = &alg
	_, err = ev.Evaluate(ctx, c, Request{Domain: "k", Descriptors: []Descriptor{{Entries: e("gcra", run)}}})
	require.NoError(t, err)
	require.Equal(t, []string{"fg:envoytest:" + run + ":{k:gcra=" + run + "}:alg:gcra"}, alg.keys)
}

// keyRecorder is an AlgorithmRunner that records the state keys it is
// asked about and allows every check.
type keyRecorder struct {
	keys   []string
	shadow []bool
}

func (r *keyRecorder) Queue(_ context.Context, _ redis.Pipeliner, c *AlgorithmCheck) func(context.Context) (AlgorithmResult, error) {
	r.keys, r.shadow = append(r.keys, c.Key), append(r.shadow, c.Shadow)
	return func(context.Context) (AlgorithmResult, error) {
		return AlgorithmResult{Allowed: true, Limit: int64(c.Limit), Remaining: int64(c.Limit) - 1, Penalty: 1}, nil
	}
}

// Global quota mode (envoy ratelimit's QUOTA_MODE) reaches what the
// differential test cannot: a fail-closed limit's answer while Redis is
// down, and Floodgate's algorithms, which then report and never deny.
func TestGlobalQuotaModeReachesFailPoliciesAndAlgorithms(t *testing.T) {
	c := loadYAML(t, `domain: q
descriptors:
  - key: closed
    # floodgate: {fail: closed}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: gcra
    # floodgate: {algorithm: gcra}
    rate_limit: {unit: minute, requests_per_unit: 10}
`)
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	t.Cleanup(func() { down.Close() })
	closed := Request{Domain: "q", Descriptors: []Descriptor{{Entries: e("closed", "c")}}}
	for _, quota := range []bool{false, true} {
		resp, err := (&Evaluator{Redis: down, Prefix: "fg:envoytest:", GlobalQuota: quota}).Evaluate(context.Background(), c, closed)
		require.NoError(t, err, "the fail policy answers")
		require.True(t, resp.Degraded)
		want := map[bool]Code{false: CodeOverLimit, true: CodeOK}[quota]
		require.Equal(t, want, resp.Overall, "global quota mode %v", quota)
		require.Equal(t, want, resp.Statuses[0].Code)
	}

	for _, quota := range []bool{false, true} {
		var alg keyRecorder
		_, err := (&Evaluator{Redis: redistest.Client(t), Prefix: "fg:envoytest:", GlobalQuota: quota, Algorithms: &alg}).Evaluate(context.Background(), c,
			Request{Domain: "q", Descriptors: []Descriptor{{Entries: e("gcra", "g")}}})
		require.NoError(t, err)
		require.Equal(t, []bool{quota}, alg.shadow, "the algorithm reports without denying in global quota mode")
	}
}
