package server

import (
	"context"
	"log/slog"
	"net/http"
	"testing"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/types/known/durationpb"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
)

// TestOpenAPIDocumentMatchesServer holds the limiter to
// schemas/openapi/limiter.yaml: the routes the service mounts (its check
// API behind the runner, as services/limiter serves it) are exactly the
// document's, and real answers from a server on the local Redis — allowed,
// denied, batch, refusals — match the document.
func TestOpenAPIDocumentMatchesServer(t *testing.T) {
	d := openapitest.LoadBundled(t, openapi.Limiter)

	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, "version: 1\nrules:\n  - {id: principal, tier: principal, limit: 2, period: 1m}\n", nil)
	cs, err := callers.ParseCallers("edge:gateway:" + limitertest.TokenHash("edge-token") + ":10:user+bot+anonymous")
	require.NoError(t, err)
	s := New(Config{Callers: cs, Engine: e, Publisher: &kafkatest.Capture{}, Topic: "decisions", Gateway: "openapi",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	s.SetReady(true)
	srv := d.Serve(t, service.API{Handler: s.Handler(), Health: true, Readiness: http.HandlerFunc(s.ServeReady)}, httpapi.Options{})
	auth := http.Header{"Authorization": {"Bearer edge-token"}, "Content-Type": {"application/json"}}
	id := redistest.Unique(t, "oa")
	check := `{"principal":{"kind":"bot","id":"` + id + `"},"ip":"2001:db8::7","method":"POST","route":"/channels/{channel_id}/messages","resource":"channel:1"}`
	for i, want := range []bool{true, true, false} {
		res := d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/v1/check", Header: auth, Body: check})
		require.Equal(t, http.StatusOK, res.Status, "check %d", i)
		require.Equal(t, want, res.JSON(t)["allowed"], "check %d", i)
	}
	batch := `{"checks":[` + check + `,{"principal":{"kind":"user","id":"` + id + `"},"ip":"198.51.100.4","method":"GET","route":"/v1/items/{id}","cost":3},` +
		`{"principal":{"kind":"robot","id":"x"},"ip":"1.2.3.4","method":"GET","route":"/a"}]}`
	res := d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/v1/check/batch", Header: auth, Body: batch, Invalid: true})
	require.Equal(t, http.StatusOK, res.Status)
	require.Len(t, res.JSON(t)["results"], 3)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/v1/check/batch", Header: auth,
		Body: `{"checks":[{"principal":{"kind":"anonymous","id":"` + id + `"},"ip":"198.51.100.4","method":"GET","route":"/"}]}`})
	require.Equal(t, http.StatusOK, res.Status)

	// Refusals: a malformed body, no token, a kind the caller may not claim.
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/v1/check", Header: auth, Body: `{"principal":`, Invalid: true})
	require.Equal(t, http.StatusBadRequest, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/v1/check", Header: http.Header{"Content-Type": {"application/json"}}, Body: check})
	require.Equal(t, http.StatusUnauthorized, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/v1/check/batch", Header: http.Header{"Content-Type": {"application/json"}}, Body: batch, Invalid: true})
	require.Equal(t, http.StatusUnauthorized, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/v1/check", Header: auth,
		Body: `{"principal":{"kind":"api_key","id":"k"},"ip":"1.2.3.4","method":"GET","route":"/a"}`})
	require.Equal(t, http.StatusForbidden, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/v1/check/batch", Header: auth, Body: `{"checks":[]}`, Invalid: true})
	require.Equal(t, http.StatusBadRequest, res.Status)

	// envoy ratelimit's endpoints: /json answers 404 until a service is set
	// (the answers of envoyrls.EnvoyRLS itself are its tests'); then an
	// answer in each of its shapes, and a malformed body.
	envoyCall := `{"domain":"edge","descriptors":[{"entries":[{"key":"user","value":"` + id + `"}]}]}`
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/json", Header: auth, Body: envoyCall})
	require.Equal(t, http.StatusNotFound, res.Status)
	rls := &stubRLS{}
	s.ServeEnvoyJSON(rls)
	for code, want := range map[rlsv3.RateLimitResponse_Code]int{rlsv3.RateLimitResponse_OK: 200, rlsv3.RateLimitResponse_OVER_LIMIT: 429, rlsv3.RateLimitResponse_UNKNOWN: 500} {
		rls.resp = &rlsv3.RateLimitResponse{OverallCode: code, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: code,
			CurrentLimit:   &rlsv3.RateLimitResponse_RateLimit{Name: "per_user", RequestsPerUnit: 10, Unit: rlsv3.RateLimitResponse_RateLimit_MINUTE},
			LimitRemaining: 3, DurationUntilReset: durationpb.New(1500 * time.Millisecond)}}}
		res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/json", Header: auth, Body: envoyCall})
		require.Equal(t, want, res.Status, "%s", code)
		if got := res.JSON(t)["overallCode"]; code != rlsv3.RateLimitResponse_UNKNOWN {
			require.Equal(t, code.String(), got)
		} else {
			require.Nil(t, got, "protojson leaves out a zero enum, as envoy ratelimit's answer")
		}
	}
	rls.err = status.Error(codes.Unavailable, "redis down")
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/json", Header: auth, Body: envoyCall})
	require.Equal(t, http.StatusServiceUnavailable, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/json", Header: auth, Body: `{"domain":`, Invalid: true})
	require.Equal(t, http.StatusBadRequest, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "POST", Path: "/json", Header: http.Header{"Content-Type": {"application/json"}}, Body: envoyCall})
	require.Equal(t, http.StatusUnauthorized, res.Status)
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: "/healthcheck"})
	require.Equal(t, http.StatusOK, res.Status)
	require.Equal(t, "OK", string(res.Body))

	// The operational endpoints and the document itself.
	for _, p := range []string{"/healthz", "/readyz", "/metrics"} {
		res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: p})
		require.Less(t, res.Status, 600)
	}
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: httpapi.OpenAPIPath})
	require.Equal(t, http.StatusOK, res.Status)
	doc, err := openapi.JSON(openapi.Limiter)
	require.NoError(t, err)
	require.JSONEq(t, string(doc), string(res.Body), "the service serves its bundled document")
	res = d.Do(t, nil, srv.URL, openapitest.Request{Method: "GET", Path: httpapi.OpenAPIPath, Header: http.Header{"If-None-Match": {res.Header.Get("ETag")}}})
	require.Equal(t, http.StatusNotModified, res.Status)
	d.CheckCovered(t)
}

// stubRLS answers every call with resp, or err.
type stubRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
	resp *rlsv3.RateLimitResponse
	err  error
}

func (r *stubRLS) ShouldRateLimit(context.Context, *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	return r.resp, r.err
}
