package server

import (
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/service"
)

// TestOneOfEachOperationalEndpoint: the limiter's check API defines no
// /healthz, /readyz or /metrics of its own (they were shadowed by the
// runner's and never reached); mounted as services/limiter mounts it, there
// is one of each, and /readyz has the limiter's semantics over HTTP: JSON
// with the Redis shards, 503 "not ready" until ready and again in the drain.
func TestOneOfEachOperationalEndpoint(t *testing.T) {
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, limitertest.OneBucket, nil)
	reg := prometheus.NewRegistry()
	s := New(Config{Engine: e, Publisher: &kafkatest.Capture{}, Topic: "decisions", Gateway: "ready-test",
		Logger: slog.New(slog.DiscardHandler), Registry: reg})
	require.Equal(t, []string{"GET /healthcheck", "POST /json", "POST /v1/check", "POST /v1/check/batch"}, httpapi.Routes(s.Handler()),
		"the check API and envoy ratelimit's two endpoints alone")

	run := service.NewRunnerWith(service.Env{Registry: reg}, service.RunnerConfig{HTTP: httpapi.DefaultServerConfig()})
	run.OnReady(s.SetReady)
	mux := run.Mount(service.API{Handler: s.Handler(), Health: true, Readiness: http.HandlerFunc(s.ServeReady)})
	for _, p := range []string{"GET /healthz", "GET /readyz", "GET /metrics"} {
		require.Contains(t, mux.Routes(), p)
	}
	hs := httptest.NewServer(mux)
	t.Cleanup(hs.Close)

	get := func(path string) (int, string, string) {
		t.Helper()
		resp, err := http.Get(hs.URL + path)
		require.NoError(t, err)
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		require.NoError(t, err)
		return resp.StatusCode, resp.Header.Get("Content-Type"), string(b)
	}
	readiness := func(body string) Readiness {
		t.Helper()
		var r Readiness
		require.NoError(t, json.Unmarshal([]byte(body), &r), body)
		return r
	}

	code, _, _ := get("/healthz")
	require.Equal(t, http.StatusOK, code, "live while the process runs")
	code, ctype, body := get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code, "not ready before start-up ends")
	require.Equal(t, "application/json", ctype)
	require.Equal(t, "not ready", readiness(body).Status)

	s.SetReady(true) // what the runner's OnReady hook does at the end of start-up
	code, _, body = get("/readyz")
	require.Equal(t, http.StatusOK, code)
	r := readiness(body)
	require.Equal(t, "ok", r.Status)
	require.NotEmpty(t, r.Redis, "each shard's breaker state")

	resp, err := http.Post(hs.URL+"/v1/check", "application/json", strings.NewReader(
		`{"principal":{"kind":"bot","id":"`+redistest.Unique(t, "ready")+`"},"ip":"203.0.113.7","method":"GET","route":"/a"}`))
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	code, _, body = get("/metrics")
	require.Equal(t, http.StatusOK, code)
	require.Contains(t, body, "floodgate_limiter_", "the registry the limiter counts on")

	s.SetReady(false) // the drain
	code, _, body = get("/readyz")
	require.Equal(t, http.StatusServiceUnavailable, code)
	require.Equal(t, "not ready", readiness(body).Status)
}
