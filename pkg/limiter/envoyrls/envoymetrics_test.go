package envoyrls

import (
	"context"
	"fmt"
	"log/slog"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// TestEnvoyDescriptorMetrics: envoy ratelimit's per-descriptor stats as
// Prometheus counters — by the limit's configuration path, by the call's own
// entries with detailed_metric — with hits within, near and over the limit;
// and the RateLimit-* headers of LIMIT_RESPONSE_HEADERS_ENABLED.
func TestEnvoyDescriptorMetrics(t *testing.T) {
	rdb := redistest.Client(t)
	src, domain, _ := envoySource(t, "metrics", `domain: DOMAIN
descriptors:
  - key: database
    value: users
    rate_limit: {unit: hour, requests_per_unit: 5}
  - key: user
    detailed_metric: true
    rate_limit: {unit: hour, requests_per_unit: 2}
`)
	e := limitertest.Engine(t, rdb, limitertest.OneBucket, nil)
	reg := prometheus.NewRegistry()
	s := server.New(server.Config{Engine: e, Publisher: &kafkatest.Capture{}, Topic: "decisions", Gateway: "envoy-test",
		Logger: slog.New(slog.DiscardHandler), Registry: reg})
	conn, _ := dialService(t, s, WithEnvoyConfig(&EnvoyConfig{Source: src, Headers: DefaultEnvoyHeaders(),
		Evaluator: &envoyconf.Evaluator{Redis: rdb, Prefix: "fg:envoytest:" + domain + ":"}}))
	rls := rlsv3.NewRateLimitServiceClient(conn)

	var last *rlsv3.RateLimitResponse
	var err error
	for range 6 {
		last, err = rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("database", "users")}})
		require.NoError(t, err)
	}
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, last.GetOverallCode())
	h := headerMap(last)
	require.Equal(t, "5", h["RateLimit-Limit"])
	require.Equal(t, "0", h["RateLimit-Remaining"])
	require.NotEmpty(t, h["RateLimit-Reset"])
	for range 3 {
		_, err = rls.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.Descriptor("user", "alice")}})
		require.NoError(t, err)
	}

	want := map[[2]string]float64{
		{"database_users", "total"}: 6, {"database_users", "within_limit"}: 5, {"database_users", "near_limit"}: 1, {"database_users", "over_limit"}: 1,
		{"user_alice", "total"}: 3, {"user_alice", "within_limit"}: 2, {"user_alice", "near_limit"}: 1, {"user_alice", "over_limit"}: 1,
	}
	got := map[[2]string]float64{}
	for _, m := range promtest.Gather(t, reg, "floodgate_limiter_envoy_descriptor_hits_total") {
		require.Equal(t, domain, m.Labels["domain"])
		got[[2]string{m.Labels["descriptor"], m.Labels["outcome"]}] = m.Value
	}
	require.Equal(t, want, got)
}

func TestEnvoyDetailedMetricSeriesAreBounded(t *testing.T) {
	m := newEnvoyDescriptorMetrics(prometheus.NewRegistry())
	for i := range maxDetailedSeries {
		require.NotEqual(t, overflowDescriptor, m.detailedName(envoyconf.Descriptor{Entries: []envoyconf.Entry{{Key: "user", Value: fmt.Sprint(i)}}}))
	}
	require.Equal(t, overflowDescriptor, m.detailedName(envoyconf.Descriptor{Entries: []envoyconf.Entry{{Key: "user", Value: "one more"}}}))
	require.Equal(t, "user_7", m.detailedName(envoyconf.Descriptor{Entries: []envoyconf.Entry{{Key: "user", Value: "7"}}}), "a known one keeps its name")
}

// The series cache holds about maxCachedLimits limits (a reload brings new
// ones) and counts each limit's hits on its own series throughout.
func TestEnvoyDescriptorSeriesCacheIsBounded(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := newEnvoyDescriptorMetrics(reg)
	const n = maxCachedLimits + 10
	limits := make([]*envoyconf.Limit, n)
	for i := range limits {
		limits[i] = &envoyconf.Limit{Path: fmt.Sprintf("d.key_%d", i%3), RequestsPerUnit: 100}
		m.observe("d", envoyconf.Descriptor{}, envoyconf.Status{Limit: limits[i], Code: envoyconf.CodeOK, Count: 1}, 1, DefaultNearLimitRatio)
		require.LessOrEqual(t, m.cached.Load(), int64(maxCachedLimits))
	}
	m.observe("d", envoyconf.Descriptor{}, envoyconf.Status{Limit: limits[0], Code: envoyconf.CodeOverLimit, Count: 102}, 2, DefaultNearLimitRatio)
	for k := range 3 {
		want := float64(n / 3)
		if k < n%3 {
			want++
		}
		if k == 0 {
			want += 2
		}
		require.Equal(t, want, promtest.Value(t, reg, "floodgate_limiter_envoy_descriptor_hits_total",
			map[string]string{"domain": "d", "descriptor": fmt.Sprintf("key_%d", k), "outcome": "total"}), "key_%d", k)
	}
	require.Equal(t, 2.0, promtest.Value(t, reg, "floodgate_limiter_envoy_descriptor_hits_total",
		map[string]string{"domain": "d", "descriptor": "key_0", "outcome": "over_limit"}))
}

// Each answer is counted as envoy ratelimit's BaseRateLimiter counts it:
// of a call that crosses the limit only the hits past it are over_limit,
// and those between the near threshold (floor(limit × ratio), in float32)
// and the limit near_limit.
func TestEnvoyDescriptorStatsCountAsEnvoyRatelimits(t *testing.T) {
	limit := &envoyconf.Limit{Path: "d.k", RequestsPerUnit: 10, Unit: envoyconf.UnitMinute}
	three := &envoyconf.Limit{Path: "d.three", RequestsPerUnit: 3, Unit: envoyconf.UnitMinute}
	for _, c := range []struct {
		name  string
		st    envoyconf.Status
		hits  uint64
		ratio float64
		want  map[string]float64
	}{
		{"allowed, crossing the near threshold", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOK, Count: 9}, 2, 0.8,
			map[string]float64{"total": 2, "within_limit": 2, "near_limit": 1}},
		{"allowed, past the near threshold", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOK, Count: 9}, 1, 0.8,
			map[string]float64{"total": 1, "within_limit": 1, "near_limit": 1}},
		{"allowed, at the near threshold", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOK, Count: 8}, 1, 0.8,
			map[string]float64{"total": 1, "within_limit": 1}},
		{"crossing the limit", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOverLimit, Count: 12}, 3, 0.8,
			map[string]float64{"total": 3, "over_limit": 2, "near_limit": 1}},
		{"past the limit", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOverLimit, Count: 11}, 1, 0.8,
			map[string]float64{"total": 1, "over_limit": 1}},
		{"shadow mode, crossing", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOK, Shadowed: true, Count: 12}, 3, 0.8,
			map[string]float64{"total": 3, "over_limit": 2, "near_limit": 1, "shadow_mode": 2}},
		{"quota mode", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOK, QuotaExceeded: true, Count: 11}, 1, 0.8,
			map[string]float64{"total": 1, "over_limit": 1}},
		{"the local cache", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOverLimit, Cached: true, Count: 12}, 2, 0.8,
			map[string]float64{"total": 2, "over_limit": 2, "over_limit_with_local_cache": 2}},
		{"another ratio", envoyconf.Status{Limit: limit, Code: envoyconf.CodeOK, Count: 6}, 1, 0.5,
			map[string]float64{"total": 1, "within_limit": 1, "near_limit": 1}},
		{"float32 threshold: floor(3 × 0.8) = 2", envoyconf.Status{Limit: three, Code: envoyconf.CodeOK, Count: 3}, 1, 0.8,
			map[string]float64{"total": 1, "within_limit": 1, "near_limit": 1}},
	} {
		t.Run(c.name, func(t *testing.T) {
			reg := prometheus.NewRegistry()
			m := newEnvoyDescriptorMetrics(reg)
			m.observe("d", envoyconf.Descriptor{}, c.st, c.hits, c.ratio)
			got := map[string]float64{}
			for _, s := range promtest.Gather(t, reg, "floodgate_limiter_envoy_descriptor_hits_total") {
				got[s.Labels["outcome"]] = s.Value
			}
			require.Equal(t, c.want, got)
		})
	}
}
