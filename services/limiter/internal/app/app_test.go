package app

import (
	"context"
	"encoding/json"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
)

// startLimiter runs the limiter app configured by env until the test ends.
func startLimiter(t *testing.T, env map[string]string) *stacktest.Service {
	t.Helper()
	return stacktest.Start(t, "limiter", func(ctx context.Context, log *slog.Logger) error {
		return Run(ctx, service.NewEnv("limiter", service.Stdio{Getenv: stacktest.Getenv(env)}, log))
	})
}

// rlsClient waits until the limiter's gRPC health service says SERVING for
// service ("" for the server as a whole) and returns a rate-limit service
// client on the same connection.
func rlsClient(t *testing.T, ctx context.Context, addr, service string) rlsv3.RateLimitServiceClient {
	t.Helper()
	return rlsClientWith(t, ctx, addr, service, insecure.NewCredentials())
}

// rlsClientWith is rlsClient over the transport creds.
func rlsClientWith(t *testing.T, ctx context.Context, addr, service string, creds credentials.TransportCredentials) rlsv3.RateLimitServiceClient {
	t.Helper()
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(creds))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	health := healthpb.NewHealthClient(conn)
	require.Eventually(t, func() bool {
		r, err := health.Check(ctx, &healthpb.HealthCheckRequest{Service: service})
		return err == nil && r.GetStatus() == healthpb.HealthCheckResponse_SERVING
	}, 10*time.Second, 50*time.Millisecond)
	return rlsv3.NewRateLimitServiceClient(conn)
}

// requireTwoOfThree sends a new bot's check three times in Floodgate's
// descriptor shape to a limiter whose principal limit is 2 a minute: OK,
// OK, OVER_LIMIT.
func requireTwoOfThree(t *testing.T, ctx context.Context, rls rlsv3.RateLimitServiceClient, bot string) {
	t.Helper()
	d := &rlcommon.RateLimitDescriptor{}
	for _, kv := range [][2]string{{"principal_kind", "bot"}, {"principal_id", redistest.Unique(t, bot)},
		{"remote_address", "203.0.113.9"}, {"method", "GET"}, {"route", "/x"}} {
		d.Entries = append(d.Entries, &rlcommon.RateLimitDescriptor_Entry{Key: kv[0], Value: kv[1]})
	}
	var codes []rlsv3.RateLimitResponse_Code
	for range 3 {
		r, err := rls.ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{d}})
		require.NoError(t, err)
		codes = append(codes, r.GetOverallCode())
	}
	require.Equal(t, []rlsv3.RateLimitResponse_Code{rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OK, rlsv3.RateLimitResponse_OVER_LIMIT}, codes)
}

// The limiter binary's wiring: HTTP, Envoy's rate-limit service with gRPC health,
// and the pprof listener, against the local Redis and Kafka-protocol broker.
func TestRunServesEnvoyRateLimitServiceAndHealth(t *testing.T) {
	redistest.Client(t) // fails loudly when the local Redis is missing
	httpAddr, grpcAddr, debugAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	env := map[string]string{
		"FLOODGATE_LIMITER_ADDR": httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR": grpcAddr, "FLOODGATE_LIMITER_DEBUG_ADDR": debugAddr,
		"FLOODGATE_GATEWAY": "app-test", "FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "2", "FLOODGATE_LIMITER_PRINCIPAL_PERIOD": "1m",
		"FLOODGATE_LIMITER_INFLUX_INTERVAL": "0",
	}
	lim := startLimiter(t, env)
	ctx := t.Context()
	rls := rlsClient(t, ctx, grpcAddr, "envoy.service.ratelimit.v3.RateLimitService")
	requireTwoOfThree(t, ctx, rls, "app_bot")

	resp, err := http.Get("http://" + debugAddr + "/debug/pprof/")
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	// The check API serves its OpenAPI document (schemas/openapi/limiter.yaml, bundled).
	want, err := openapi.JSON(openapi.Limiter)
	require.NoError(t, err)
	openapitest.CheckServed(t, "http://"+httpAddr, want)

	// /readyz on the check port is the limiter's own JSON readiness (Redis
	// shards, the master in use, journal), not the runner's plain "ok" that
	// shadowed it; the runner answers it through the limiter's handler.
	resp, err = http.Get("http://" + httpAddr + "/readyz")
	require.NoError(t, err)
	var ready struct {
		Status      string            `json:"status"`
		Redis       map[string]string `json:"redis"`
		RedisMaster string            `json:"redis_master"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&ready))
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Equal(t, "application/json", resp.Header.Get("Content-Type"))
	require.Equal(t, "ok", ready.Status)
	require.NotEmpty(t, ready.Redis, "the shards' breaker states")
	require.Equal(t, config.DefaultRedisAddrs, ready.RedisMaster, "the master in use, from the Redis topology")

	// /metrics on the check port is the runner's, on the registry the
	// limiter's engine and server count on.
	resp, err = http.Get("http://" + httpAddr + "/metrics")
	require.NoError(t, err)
	metrics, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Contains(t, string(metrics), "floodgate_redis_master")
	require.Contains(t, string(metrics), "floodgate_limiter_redis_errors_total")

	require.NoError(t, lim.Stop())
}

// The limiter's reverse-proxy mode: requests through it reach the upstream until
// the (in-process) decision denies, then get the 429 contract; the principal comes
// from headers only through a trusted proxy, the route from the configured templates.
func TestRunReverseProxyMode(t *testing.T) {
	redistest.Client(t)
	hits, seen := 0, ""
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		hits++
		seen = r.Header.Get("X-Principal-Kind") + ":" + r.Header.Get("X-Principal-Id")
	}))
	defer upstream.Close()
	httpAddr, proxyAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	env := map[string]string{
		"FLOODGATE_LIMITER_ADDR": httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR": "off", "FLOODGATE_GATEWAY": "proxy-test",
		"FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "2", "FLOODGATE_LIMITER_PRINCIPAL_PERIOD": "1m", "FLOODGATE_LIMITER_INFLUX_INTERVAL": "0",
		"FLOODGATE_LIMITER_PROXY_ADDR": proxyAddr, "FLOODGATE_LIMITER_PROXY_UPSTREAM": upstream.URL,
		"FLOODGATE_LIMITER_PROXY_ROUTES":  "POST /channels/{channel_id}/messages resource=channel:{channel_id}",
		"FLOODGATE_LIMITER_PROXY_TRUSTED": "127.0.0.1", "FLOODGATE_LIMITER_PROXY_IDENTITY_TRUSTED": "127.0.0.1",
	}
	lim := startLimiter(t, env)
	stacktest.WaitOK(t, "http://"+httpAddr+"/readyz", 10*time.Second)

	id := redistest.Unique(t, "proxy_bot")
	codes, last := stacktest.PostAs(t, "http://"+proxyAddr+"/channels/7/messages", "bot", id, 3)
	require.Equal(t, []int{200, 200, 429}, codes)
	require.Equal(t, 2, hits, "the denied request never reached the upstream")
	require.Equal(t, "bot:"+id, seen, "the upstream reads the principal the check was made for")
	require.Equal(t, "2", last.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "30", last.Header.Get("Retry-After"))
	require.Equal(t, "application/problem+json", last.Header.Get("Content-Type"))
	require.NoError(t, lim.Stop())
}
