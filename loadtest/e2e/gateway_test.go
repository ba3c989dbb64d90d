package e2e

import (
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestReverseProxyEnforcesRealLimiter puts pkg/gateway's reverse proxy in front of
// an upstream, asking the real limiter binary (real Redis, real broker): the first
// requests reach the upstream, the rest get the limiter's 429 contract.
func TestReverseProxyEnforcesRealLimiter(t *testing.T) {
	ctx := stacktest.Context(t, 2*time.Minute, "end-to-end test needs the local stack; run `make test`")
	brokers := migrationstest.Broker(t, ctx, migrations.Runner{})
	bin := buildServices(t)
	addr := stacktest.FreeAddr(t)
	redisAddrs := stacktest.Local().RedisAddrs
	stacktest.Exec(t, filepath.Join(bin, "limiter"), []string{
		"FLOODGATE_KAFKA_BROKERS=" + brokers, "FLOODGATE_REDIS_ADDRS=" + strings.Join(redisAddrs, ","),
		"FLOODGATE_LIMITER_ADDR=" + addr, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT=3", "FLOODGATE_LIMITER_PRINCIPAL_PERIOD=1m",
	})
	waitReady(t, "http://"+addr+"/readyz")

	hits := 0
	upstream := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) { hits++ }))
	defer upstream.Close()
	u, _ := url.Parse(upstream.URL)
	trusted, err := gateway.ParseTrustedProxies([]string{"127.0.0.1"})
	require.NoError(t, err)
	router, err := gateway.NewRouter([]gateway.Route{{Method: "POST", Template: "/channels/{channel_id}/messages", Resource: "channel:{channel_id}"}}, "")
	require.NoError(t, err)
	proxy, err := gateway.NewReverseProxy(u, gateway.Options{
		Checker: gateway.NewClient("http://"+addr, time.Second), Router: router, TrustedProxies: trusted,
		Principal: gateway.PrincipalFromHeaders("X-Principal-Kind", "X-Principal-Id", trusted),
	})
	require.NoError(t, err)
	front := httptest.NewServer(proxy)
	defer front.Close()

	id := fmt.Sprintf("gw_bot_%d", time.Now().UnixNano())
	codes, last := stacktest.PostAs(t, front.URL+"/channels/42/messages", "bot", id, 5)
	require.Equal(t, []int{200, 200, 200, 429, 429}, codes)
	require.Equal(t, 3, hits, "denied requests never reach the upstream")
	require.Equal(t, "3", last.Header.Get("X-RateLimit-Limit"))
	require.Equal(t, "0", last.Header.Get("X-RateLimit-Remaining"))
	require.Equal(t, "principal", last.Header.Get("X-RateLimit-Scope"))
	require.Equal(t, "20", last.Header.Get("Retry-After"), "one token per 20s at 3 per minute")
	require.Equal(t, "application/problem+json", last.Header.Get("Content-Type"))
}
