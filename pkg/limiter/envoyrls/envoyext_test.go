package envoyrls

import (
	"context"
	"log/slog"
	"net/http/httptest"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// envoyExt is an RLS serving one envoy configuration file (DOMAIN in it is
// replaced by a domain of the test's own) with Identity on, on real Redis.
type envoyExt struct {
	rls    rlsv3.RateLimitServiceClient
	pub    *kafkatest.Capture
	rdb    redis.UniversalClient
	src    *envoyconf.Source
	dir    string
	domain string
	eng    *limiter.Engine
	reg    *prometheus.Registry
}

type envoyExtOpts struct {
	rules       string                // the rules file; limitertest.OneBucket when empty
	evalRedis   redis.UniversalClient // the evaluator's Redis; the test's when nil
	failureDeny bool                  // EnvoyConfig.FailureModeDeny
	drop        bool                  // drop the events (benchmarks)
	publisher   server.Publisher      // the events' publisher (benchmarks); overrides drop
	topic       string                // the events' topic; "decisions" when empty
	anonymous   bool                  // no EnvoyIdentity: calls name no principal, no events
	inProcess   bool                  // call the handler directly, without a transport (benchmarks)
	localCache  int                   // the evaluator's LocalCache, this many counters; 0: none
}

// inProcessRLS calls a handler as a client would, without a transport: a
// benchmark of the handler alone.
type inProcessRLS struct{ h *EnvoyRLS }

func (c inProcessRLS) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest, _ ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	return c.h.ShouldRateLimit(ctx, in)
}

// envoySource writes yaml, with DOMAIN replaced by a domain of the test's
// own (prefix…), as an envoy ratelimit configuration directory and opens it.
func envoySource(t testing.TB, prefix, yaml string) (src *envoyconf.Source, domain, dir string) {
	t.Helper()
	domain = redistest.Unique(t, prefix)
	dir = t.TempDir()
	require.NoError(t, os.WriteFile(filepath.Join(dir, "e.yaml"), []byte(strings.ReplaceAll(yaml, "DOMAIN", domain)), 0o644))
	src, err := envoyconf.OpenDir(dir, envoyconf.Options{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	return src, domain, dir
}

func newEnvoyExt(t testing.TB, yaml string, o envoyExtOpts) envoyExt {
	t.Helper()
	rdb := redistest.Client(t)
	src, domain, dir := envoySource(t, "envoyext", yaml)
	rules := o.rules
	if rules == "" {
		rules = limitertest.OneBucket
	}
	e := limitertest.Engine(t, rdb, rules, nil)
	require.NoError(t, e.Load(context.Background()))
	reg := prometheus.NewRegistry()
	pub := &kafkatest.Capture{}
	var publisher server.Publisher = pub
	if o.drop {
		publisher = limitertest.DropPublisher{}
	}
	if o.publisher != nil {
		publisher = o.publisher
	}
	topic := o.topic
	if topic == "" {
		topic = "decisions"
	}
	s := server.New(server.Config{Engine: e, Publisher: publisher, Topic: topic, Gateway: "envoy-ext",
		Logger: slog.New(slog.DiscardHandler), Registry: reg})
	keys, err := ParseEnvoyPrincipalKeys(DefaultEnvoyPrincipalKeys, "remote_address")
	require.NoError(t, err)
	evalRedis := o.evalRedis
	if evalRedis == nil {
		evalRedis = rdb
	}
	ec := &EnvoyConfig{Source: src,
		Evaluator: &envoyconf.Evaluator{Redis: evalRedis, Prefix: "fg:envoyext:" + domain + ":", Algorithms: NewEnvoyAlgorithms(evalRedis)},
		Identity:  &EnvoyIdentity{Keys: keys, IPKey: "remote_address", MethodKey: "method"}, FailureModeDeny: o.failureDeny}
	if o.anonymous {
		ec.Identity = nil
	}
	if o.localCache > 0 {
		ec.Evaluator.LocalCache = envoyconf.NewLocalCache(o.localCache)
	}
	var rls rlsv3.RateLimitServiceClient
	switch {
	case o.inProcess:
		ec.Evaluator.Coalescer = &redisx.Coalescer{Redis: evalRedis} // as the limiter runs it
		rls = inProcessRLS{NewEnvoyRLS(s, WithEnvoyConfig(ec))}
	case os.Getenv(jsonEnv) != "": // the check API's /json (TestEnvoyExtTestsOverJSON)
		s.ServeEnvoyJSON(NewEnvoyRLS(s, WithEnvoyConfig(ec)))
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		rls = limitertest.JSONClient{URL: srv.URL}
	default:
		conn, _ := dialService(t, s, WithEnvoyConfig(ec))
		rls = rlsv3.NewRateLimitServiceClient(conn)
	}
	return envoyExt{rls: rls, pub: pub, rdb: rdb, src: src, dir: dir, domain: domain, eng: e, reg: reg}
}

func (f envoyExt) call(t testing.TB, ds ...*rlcommon.RateLimitDescriptor) *rlsv3.RateLimitResponse {
	t.Helper()
	r, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: f.domain, Descriptors: ds})
	require.NoError(t, err)
	return r
}

func (f envoyExt) events(t testing.TB) []events.Decision {
	t.Helper()
	out := make([]events.Decision, len(f.pub.Messages()))
	for i, m := range f.pub.Messages() {
		ev, err := events.DecodeDecision(m.Value)
		require.NoError(t, err)
		out[i] = ev
	}
	return out
}

// codes of n calls of ds, in order: "OK" or "OVER_LIMIT".
func (f envoyExt) run(t testing.TB, n int, ds ...*rlcommon.RateLimitDescriptor) string {
	t.Helper()
	var out []string
	for range n {
		out = append(out, f.call(t, ds...).GetOverallCode().String())
	}
	return strings.Join(out, " ")
}

// TestEnvoyExtensionSwitchesTheAlgorithm: the same limit (4 per minute)
// counts as envoy ratelimit's fixed window without a floodgate comment, and
// as the algorithm its comment names with one — on real Redis, and again
// after a hot reload changes the comment.
func TestEnvoyExtensionSwitchesTheAlgorithm(t *testing.T) {
	const conf = `domain: DOMAIN
descriptors:
  - key: plain
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: tb
    # floodgate: {algorithm: token_bucket, burst: 2}
    rate_limit: {unit: minute, requests_per_unit: 4}
  - key: gcra
    rate_limit: {unit: minute, requests_per_unit: 4} # floodgate: {algorithm: gcra, burst: 1}
  - key: sw
    # floodgate: {algorithm: sliding_window}
    rate_limit: {unit: minute, requests_per_unit: 4}
`
	f := newEnvoyExt(t, conf, envoyExtOpts{})
	u := redistest.Unique(t, "u")
	// Envoy's fixed window counts every hit, the denied ones included.
	require.Equal(t, "OK OK OK OK OVER_LIMIT OVER_LIMIT", f.run(t, 6, limitertest.Descriptor("plain", u)))
	// A token bucket of burst 2 refilling 4 a minute: two at once, then no more.
	require.Equal(t, "OK OK OVER_LIMIT OVER_LIMIT", f.run(t, 4, limitertest.Descriptor("tb", u)))
	// GCRA with a burst of 1: one, then one every 15 s.
	r := f.call(t, limitertest.Descriptor("gcra", u))
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	require.Equal(t, uint32(4), r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit())
	require.Equal(t, rlsv3.RateLimitResponse_RateLimit_MINUTE, r.GetStatuses()[0].GetCurrentLimit().GetUnit())
	r = f.call(t, limitertest.Descriptor("gcra", u))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetOverallCode())
	require.InDelta(t, 15, r.GetStatuses()[0].GetDurationUntilReset().AsDuration().Seconds(), 1.5)
	// A sliding window of 4 a minute: 4, and denials consume nothing.
	require.Equal(t, "OK OK OK OK OVER_LIMIT OVER_LIMIT", f.run(t, 6, limitertest.Descriptor("sw", u), limitertest.Descriptor("user", u)))
	keys, err := f.rdb.Keys(context.Background(), "fg:envoyext:"+f.domain+":*alg:sliding_window").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1, "the algorithm's state, named by its algorithm")
	require.Equal(t, "4", f.rdb.HGet(context.Background(), keys[0], "c").Val(), "denied calls consumed nothing")

	// The event of a denial names the limit's path, as for fixed windows.
	evs := f.events(t)
	last := evs[len(evs)-1]
	require.False(t, last.Allowed)
	require.Equal(t, "/"+f.domain+"/sw", last.Route)

	// Hot reload: the plain limit becomes a token bucket of burst 1, with a
	// fresh state; an invalid comment keeps it.
	v := redistest.Unique(t, "v")
	write := func(s string) {
		require.NoError(t, os.WriteFile(filepath.Join(f.dir, "e.yaml"), []byte(strings.ReplaceAll(s, "DOMAIN", f.domain)), 0o644))
	}
	write(strings.Replace(conf, "  - key: plain\n", "  - key: plain\n    # floodgate: {algorithm: token_bucket, burst: 1}\n", 1))
	changed, err := f.src.Reload()
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, "OK OVER_LIMIT", f.run(t, 2, limitertest.Descriptor("plain", v)))
	write(strings.Replace(conf, "  - key: plain\n", "  - key: plain\n    # floodgate: {algorithm: leaky_buckets}\n", 1))
	_, err = f.src.Reload()
	require.ErrorContains(t, err, "e.yaml:4: floodgate comment: algorithm \"leaky_buckets\"")
	require.Equal(t, limiter.TokenBucket, f.src.Config().Lookup(f.domain, []envoyconf.Entry{{Key: "plain", Value: "x"}}).Limit.Algorithm(),
		"an invalid edit keeps the configuration in force")
}

// TestEnvoyExtensionAppliesThePenalty: a principal's own descriptor counted
// by a Floodgate algorithm keeps its state in the principal's slot and gets
// the detector's penalty from the script, as on the own path.
func TestEnvoyExtensionAppliesThePenalty(t *testing.T) {
	f := newEnvoyExt(t, `domain: DOMAIN
descriptors:
  - key: user
    # floodgate: {algorithm: token_bucket}
    rate_limit: {unit: hour, requests_per_unit: 4}
`, envoyExtOpts{})
	ctx := context.Background()
	u := redistest.Unique(t, "pen")
	pk := redisx.PenaltyKey("user", u)
	require.NoError(t, f.rdb.HSet(ctx, pk, redisx.PenaltyFieldMultiplier, "0.5").Err())
	t.Cleanup(func() { f.rdb.Del(context.Background(), pk) })
	r := f.call(t, limitertest.Descriptor("user", u))
	require.Equal(t, uint32(2), r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit(), "4 × 0.5")
	require.Equal(t, "OK OVER_LIMIT", f.run(t, 2, limitertest.Descriptor("user", u)))
	ev := f.events(t)[2]
	require.Equal(t, events.TierPenalty, ev.Tier)
	require.Equal(t, 0.5, ev.PenaltyMultiplier)
	keys, err := f.rdb.Keys(ctx, "fg:envoyext:"+f.domain+":"+redisx.PrincipalTag("user", u)+"*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1, "the state lives in the principal's slot, beside its penalty")
}

// TestEnvoyDailyQuotaDeniesOnceExhausted: the principal's daily quota from
// the rules file applies to envoy-configured calls as to /v1/check — the
// call past it is OVER_LIMIT, the principal's descriptor says so (the
// quota's name, its limit per day, nothing left until the day ends) and the
// event is the quota's; a call another limit denies does not spend it.
func TestEnvoyDailyQuotaDeniesOnceExhausted(t *testing.T) {
	f := newEnvoyExt(t, `domain: DOMAIN
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: route
    value: /tight
    rate_limit: {unit: hour, requests_per_unit: 1}
`, envoyExtOpts{rules: `
version: 1
rules:
  - {id: p, tier: principal, limit: 1000, period: 1h}
quotas:
  - {kind: user, plan: default, limit: 3}
`})
	ctx := context.Background()
	u := redistest.Unique(t, "quota")
	day := redisx.DayUsageKey("user", u, time.Now().UTC().Format(time.DateOnly))
	t.Cleanup(func() { f.rdb.Del(context.Background(), day) })
	// One call spends one unit; the next is denied by the tight route and
	// gives its unit back.
	tight := limitertest.Descriptor("route", "/tight")
	require.Equal(t, "OK OVER_LIMIT", f.run(t, 2, limitertest.Descriptor("user", u), tight))
	require.Equal(t, "1", f.rdb.Get(ctx, day).Val(), "the denied call's unit refunded")
	require.Equal(t, "OK OK", f.run(t, 2, limitertest.Descriptor("user", u)))
	r := f.call(t, limitertest.Descriptor("user", u))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetOverallCode())
	st := r.GetStatuses()[0]
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, st.GetCode())
	require.Equal(t, "quota-user-default", st.GetCurrentLimit().GetName())
	require.Equal(t, uint32(3), st.GetCurrentLimit().GetRequestsPerUnit())
	require.Equal(t, rlsv3.RateLimitResponse_RateLimit_DAY, st.GetCurrentLimit().GetUnit())
	require.Zero(t, st.GetLimitRemaining())
	now := time.Now().UTC()
	untilMidnight := now.Truncate(24 * time.Hour).Add(24 * time.Hour).Sub(now)
	require.InDelta(t, untilMidnight.Seconds(), st.GetDurationUntilReset().AsDuration().Seconds(), 2)
	require.Equal(t, "3", f.rdb.Get(ctx, day).Val(), "a denied call spends nothing")
	evs := f.events(t)
	ev := evs[len(evs)-1]
	require.False(t, ev.Allowed)
	require.Equal(t, events.TierQuota, ev.Tier)
	require.Equal(t, "quota-user-default", ev.Rule)
	require.Equal(t, int64(3), ev.Limit)
	require.Zero(t, ev.Remaining)
	// Another user is not affected.
	require.Equal(t, "OK", f.run(t, 1, limitertest.Descriptor("user", u+"-other")))
}

// TestEnvoyRedisFailureIsADegradedDecision: a call whose counters cannot be
// read fails with UNAVAILABLE, as envoy ratelimit's does, and is published
// as a degraded decision, allowed or not as Envoy's failure_mode_deny makes
// it; limits with a fail policy answer by it instead, degraded and said so.
func TestEnvoyRedisFailureIsADegradedDecision(t *testing.T) {
	down := redis.NewClient(&redis.Options{Addr: "127.0.0.1:1", MaxRetries: -1, DialTimeout: 100 * time.Millisecond, DialerRetries: 1})
	t.Cleanup(func() { down.Close() })
	const conf = `domain: DOMAIN
descriptors:
  - key: user
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: closed
    # floodgate: {fail: closed}
    rate_limit: {unit: minute, requests_per_unit: 10}
  - key: open
    # floodgate: {algorithm: gcra, fail: open}
    rate_limit: {unit: minute, requests_per_unit: 10}
`
	for _, deny := range []bool{false, true} {
		f := newEnvoyExt(t, conf, envoyExtOpts{evalRedis: down, failureDeny: deny})
		u := redistest.Unique(t, "down")
		_, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: f.domain,
			Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("user", u)}})
		require.Equal(t, codes.Unavailable, status.Code(err), "%v", err)
		evs := f.events(t)
		require.Len(t, evs, 1, "the failed call is a decision event")
		require.True(t, evs[0].Degraded)
		require.Equal(t, !deny, evs[0].Allowed, "as Envoy's failure_mode_deny %v", deny)
		require.Equal(t, events.Principal{Kind: events.PrincipalUser, ID: u}, evs[0].Principal)
		require.NotNil(t, evs[0].Envoy)
	}

	f := newEnvoyExt(t, conf, envoyExtOpts{evalRedis: down})
	u := redistest.Unique(t, "down")
	r := f.call(t, limitertest.Descriptor("closed", "c"), limitertest.Descriptor("user", u), limitertest.Descriptor("open", "o"))
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetOverallCode(), "fail closed denies")
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetStatuses()[0].GetCode())
	require.Equal(t, rlsv3.RateLimitResponse_UNKNOWN, r.GetStatuses()[1].GetCode(), "no fail policy: not known")
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetStatuses()[2].GetCode(), "fail open allows")
	require.Equal(t, "redis unavailable; answered by fail policy", headerMap(r)["X-RateLimit-Error"])
	_, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: f.domain,
		Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("open", "o"), limitertest.Descriptor("user", u)}})
	require.Equal(t, codes.Unavailable, status.Code(err), "a counted limit without a fail policy fails the call")
	r = f.call(t, limitertest.Descriptor("open", "o"))
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	evs := f.events(t)
	require.Len(t, evs, 2, "no principal in the last call: not published")
	require.True(t, evs[0].Degraded, "the fail policies' answer")
	require.False(t, evs[0].Allowed)
	require.True(t, evs[1].Degraded, "the failed call")
	require.True(t, evs[1].Allowed)
}

// BenchmarkEnvoyConfigured: ShouldRateLimit for an envoy-configured domain
// over gRPC on loopback TCP (handler: called in process) against real Redis,
// one user descriptor per call
// with Identity on (events built and dropped): envoy ratelimit's fixed
// window; the same with the user's daily quota checked in the pipeline; and
// the limit counted by GCRA through a floodgate comment
// (go test -run '^$' -bench EnvoyConfigured -benchtime 2s ./pkg/limiter).
func BenchmarkEnvoyConfigured(b *testing.B) {
	const conf = `domain: DOMAIN
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: gcra_user
    # floodgate: {algorithm: gcra}
    rate_limit: {unit: second, requests_per_unit: 1000000000}
  - key: flood
    rate_limit: {unit: hour, requests_per_unit: 1}
`
	const noQuota = "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000000000, period: 1s}\n"
	const quota = noQuota + "quotas:\n  - {kind: user, plan: default, limit: 1000000000000}\n"
	for _, bc := range []struct {
		name, rules, key string
		inProcess        bool
		localCache       int
	}{
		{"fixed_window", noQuota, "user", false, 0},
		{"fixed_window+daily_quota", quota, "user", false, 0},
		{"gcra", noQuota, "gcra_user", false, 0},
		{"fixed_window/handler", noQuota, "user", true, 0}, // the handler alone: no transport's allocations in allocs/op
		// A flood on 16,000 counters past their limit (1 an hour), the
		// handler alone: every call to Redis, or to the local cache.
		{"over_limit/handler", noQuota, "flood", true, 0},
		{"over_limit/handler+local_cache", noQuota, "flood", true, 1 << 16},
	} {
		b.Run(bc.name, func(b *testing.B) {
			f := newEnvoyExt(b, conf, envoyExtOpts{rules: bc.rules, drop: true, inProcess: bc.inProcess, localCache: bc.localCache})
			want := rlsv3.RateLimitResponse_OK
			if bc.key == "flood" {
				want = rlsv3.RateLimitResponse_OVER_LIMIT
			}
			base := redistest.Unique(b, "envoy_bench")
			var worker atomic.Int64
			b.SetParallelism(16)
			b.ReportAllocs()
			b.ResetTimer()
			b.RunParallel(func(pb *testing.PB) {
				w := strconv.FormatInt(worker.Add(1), 10)
				for i := 0; pb.Next(); i++ {
					r, err := f.rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: f.domain,
						Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor(bc.key, base+"_"+w+"_"+strconv.Itoa(i%1000))}})
					if err != nil || (r.GetOverallCode() != want && (want == rlsv3.RateLimitResponse_OK || i >= 1000)) { // a flood's counter is over from its second call
						b.Errorf("should rate limit: %v %v", err, r.GetOverallCode())
						return
					}
				}
			})
			b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "calls/s")
		})
	}
}
