package envoyrls

import (
	"context"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// jsonEnv, set, serves the envoyExt tests on the check API's POST /json
// instead of gRPC (TestEnvoyExtTestsOverJSON).
const jsonEnv = "FLOODGATE_TEST_ENVOY_JSON"

// The envoy-configuration tests (the algorithm switch, penalties, the daily
// quota, a failing Redis, unknown domains) again over /json: the same
// answers, errors and decision events as over gRPC.
func TestEnvoyExtTestsOverJSON(t *testing.T) {
	runAgain(t, jsonEnv, "1", "^TestEnvoy(Extension|DailyQuota|RedisFailure|UnknownDomain)", "TestEnvoyExtensionSwitchesTheAlgorithm",
		"TestEnvoyExtensionAppliesThePenalty", "TestEnvoyDailyQuotaDeniesOnceExhausted", "TestEnvoyRedisFailureIsADegradedDecision",
		"TestEnvoyUnknownDomainAnswersOKWithoutALimit")
}

// What /json does beyond envoy ratelimit's: callers authenticate and may
// name only their principals, the deadline headers are read, the body is
// bounded, refusals are problems with a correlation id; and /healthcheck
// follows readiness.
func TestEnvoyJSONRefusesAsTheCheckAPI(t *testing.T) {
	const token = "envoy-json-token"
	cs, err := callers.ParseCallers("edge:gateway:" + limitertest.TokenHash(token) + "::user+anonymous")
	require.NoError(t, err)
	rdb := redistest.Client(t)
	src, domain, _ := envoySource(t, "envoyjson", "domain: DOMAIN\ndescriptors:\n  - key: user\n    rate_limit: {unit: minute, requests_per_unit: 2}\n")
	pub := &kafkatest.Capture{}
	s := server.New(server.Config{Engine: limitertest.Engine(t, rdb, limitertest.OneBucket, nil), Publisher: pub, Topic: "decisions",
		Gateway: "envoy-json", Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Callers: cs})
	keys, err := ParseEnvoyPrincipalKeys(DefaultEnvoyPrincipalKeys, "remote_address")
	require.NoError(t, err)
	s.ServeEnvoyJSON(NewEnvoyRLS(s, WithEnvoyConfig(&EnvoyConfig{Source: src,
		Evaluator: &envoyconf.Evaluator{Redis: rdb, Prefix: "fg:envoyjson:" + domain + ":"},
		Identity:  &EnvoyIdentity{Keys: keys, IPKey: "remote_address"}})))
	srv := httptest.NewServer(s.Handler())
	t.Cleanup(srv.Close)
	auth := http.Header{"Authorization": {"Bearer " + token}}
	call := func(c limitertest.JSONClient, ds ...*rlcommon.RateLimitDescriptor) (*rlsv3.RateLimitResponse, error) {
		return c.ShouldRateLimit(context.Background(), &rlsv3.RateLimitRequest{Domain: domain, Descriptors: ds})
	}
	u := redistest.Unique(t, "u")

	_, err = call(limitertest.JSONClient{URL: srv.URL}, limitertest.Descriptor("user", u))
	require.Equal(t, codes.Unauthenticated, status.Code(err), "no token: %v", err)
	_, err = call(limitertest.JSONClient{URL: srv.URL, Header: auth}, limitertest.Descriptor("api_key", "k1"))
	require.Equal(t, codes.PermissionDenied, status.Code(err), "a kind the caller may not name: %v", err)
	_, err = call(limitertest.JSONClient{URL: srv.URL, Header: http.Header{"Authorization": auth["Authorization"], server.HeaderEnvoyTimeout: {"0"}}}, limitertest.Descriptor("user", u))
	require.Equal(t, codes.InvalidArgument, status.Code(err), "a deadline header out of range: %v", err)
	require.Empty(t, pub.Messages(), "nothing refused was decided")

	for i, want := range []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT} {
		r, err := call(limitertest.JSONClient{URL: srv.URL, Header: auth}, limitertest.Descriptor("user", u))
		require.NoError(t, err, "call %d", i)
		require.Equal(t, want, r.GetOverallCode(), "call %d", i)
		require.Equal(t, uint32(2), r.GetStatuses()[0].GetCurrentLimit().GetRequestsPerUnit())
	}
	require.Len(t, pub.Messages(), 3, "each decided call is a decision event")
	last := limitertest.LastDecision(t, pub)
	require.Equal(t, events.Principal{Kind: events.PrincipalUser, ID: u}, last.Principal)
	require.False(t, last.Allowed)

	post := func(body string, h http.Header) (*http.Response, string) {
		req, err := http.NewRequest(http.MethodPost, srv.URL+"/json", strings.NewReader(body))
		require.NoError(t, err)
		req.Header = h.Clone()
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res, string(b)
	}
	res, body := post(`{"domain":`, auth)
	require.Equal(t, http.StatusBadRequest, res.StatusCode)
	require.Equal(t, "application/problem+json", res.Header.Get("Content-Type"))
	require.Contains(t, body, `"correlation_id":"`+res.Header.Get(httpapi.HeaderRequestID)+`"`)
	res, _ = post(`{"domain":"`+strings.Repeat("x", 1<<20)+`"}`, auth)
	require.Equal(t, http.StatusRequestEntityTooLarge, res.StatusCode)
	res, _ = post(`{"domain":"`+domain+`"}`, auth)
	require.Equal(t, http.StatusBadRequest, res.StatusCode, "no descriptors: the call's own InvalidArgument")

	get := func(path string) (int, string) {
		res, err := http.Get(srv.URL + path)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		return res.StatusCode, string(b)
	}
	code, body := get("/healthcheck")
	require.Equal(t, http.StatusInternalServerError, code, "not ready yet")
	require.Contains(t, body, `"status":"not ready"`)
	s.SetReady(true)
	code, body = get("/healthcheck")
	require.Equal(t, http.StatusOK, code)
	require.Equal(t, "OK", body)
}
