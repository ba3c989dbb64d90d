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
		{"database_users", "total"}: 6, {"database_users", "within_limit"}: 5, {"database_users", "near_limit"}: 2, {"database_users", "over_limit"}: 1,
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
		m.observe("d", envoyconf.Descriptor{}, envoyconf.Status{Limit: limits[i], Code: envoyconf.CodeOK, Count: 1}, 1)
		require.LessOrEqual(t, m.cached.Load(), int64(maxCachedLimits))
	}
	m.observe("d", envoyconf.Descriptor{}, envoyconf.Status{Limit: limits[0], Code: envoyconf.CodeOverLimit, Count: 101}, 2)
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
