package app

import (
	"context"
	"crypto/tls"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// TestGRPCOverMutualTLS serves Envoy's rate-limit service over mutual TLS
// (FLOODGATE_LIMITER_GRPC_TLS_*, envoy ratelimit's GRPC_SERVER_USE_TLS with
// GRPC_CLIENT_TLS_CACERT and _SAN) on both gRPC transports: a gateway
// whose certificate the client CA signed and which carries an allowed name
// is answered, limits enforced; plaintext, no certificate, another CA's
// certificate and an unnamed one are not.
func TestGRPCOverMutualTLS(t *testing.T) {
	redistest.Client(t)
	ca, other := tlstest.NewCA(t, "grpc-tls"), tlstest.NewCA(t, "not-ours")
	server := ca.Server("limiter")
	gateway := ca.Server("envoy", "envoy.edge.example") // a client certificate carrying a DNS name
	unnamed := ca.Client("someone")
	stranger := other.Server("envoy", "envoy.edge.example")
	for _, transport := range []string{envoyrls.TransportFloodgate, envoyrls.TransportGRPCGo} {
		t.Run(transport, func(t *testing.T) {
			httpAddr, grpcAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
			lim := startLimiter(t, map[string]string{
				"FLOODGATE_LIMITER_ADDR": httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR": grpcAddr, "FLOODGATE_LIMITER_GRPC_TRANSPORT": transport,
				"FLOODGATE_GATEWAY": "tls-test", "FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "2", "FLOODGATE_LIMITER_PRINCIPAL_PERIOD": "1m",
				"FLOODGATE_LIMITER_INFLUX_INTERVAL":    "0",
				"FLOODGATE_LIMITER_GRPC_TLS_CERT_FILE": server.CertFile, "FLOODGATE_LIMITER_GRPC_TLS_KEY_FILE": server.KeyFile,
				"FLOODGATE_LIMITER_GRPC_TLS_CLIENT_CA_FILE": ca.CertFile, "FLOODGATE_LIMITER_GRPC_TLS_CLIENT_NAMES": "envoy.edge.example",
			})
			ctx := t.Context()
			as := func(pair *tlstest.Pair) credentials.TransportCredentials {
				c := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
				if pair != nil {
					c.Certificates = []tls.Certificate{pair.TLS}
				}
				return credentials.NewTLS(c)
			}
			rls := rlsClientWith(t, ctx, grpcAddr, "envoy.service.ratelimit.v3.RateLimitService", as(&gateway))
			requireTwoOfThree(t, ctx, rls, "tls_bot")
			require.Contains(t, lim.Log.String(), "grpc_tls=mutual", "the start line says so")

			for name, creds := range map[string]credentials.TransportCredentials{
				"plaintext": insecure.NewCredentials(), "no client certificate": as(nil),
				"another CA's certificate": as(&stranger), "a certificate naming no allowed client": as(&unnamed),
			} {
				conn, err := grpc.NewClient(grpcAddr, grpc.WithTransportCredentials(creds))
				require.NoError(t, err)
				cctx, cancel := context.WithTimeout(ctx, 3*time.Second)
				_, err = healthpb.NewHealthClient(conn).Check(cctx, &healthpb.HealthCheckRequest{})
				cancel()
				_ = conn.Close()
				require.Error(t, err, "%s: refused", name)
			}
		})
	}
}

// TestCheckAPIOverTLS serves the check API, its probes and metrics over TLS
// (FLOODGATE_HTTP_TLS_*) on both HTTP servers: a client that trusts the CA
// is answered and the limit enforced; a plaintext request is not served.
func TestCheckAPIOverTLS(t *testing.T) {
	redistest.Client(t)
	ca := tlstest.NewCA(t, "http-tls")
	server := ca.Server("limiter")
	client := &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: ca.Pool()}}}
	for _, transport := range []string{httpapi.TransportFastHTTP, httpapi.TransportNetHTTP} {
		t.Run(transport, func(t *testing.T) {
			addr := stacktest.FreeAddr(t)
			lim := startLimiter(t, map[string]string{
				"FLOODGATE_LIMITER_ADDR": addr, "FLOODGATE_LIMITER_GRPC_ADDR": "off", "FLOODGATE_LIMITER_HTTP_SERVER": transport,
				"FLOODGATE_GATEWAY": "tls-test", "FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "2", "FLOODGATE_LIMITER_PRINCIPAL_PERIOD": "1m",
				"FLOODGATE_LIMITER_INFLUX_INTERVAL": "0",
				"FLOODGATE_HTTP_TLS_CERT_FILE":      server.CertFile, "FLOODGATE_HTTP_TLS_KEY_FILE": server.KeyFile,
			})
			require.Eventually(t, func() bool {
				resp, err := client.Get("https://" + addr + "/readyz")
				if err != nil {
					return false
				}
				resp.Body.Close()
				return resp.StatusCode == http.StatusOK
			}, 15*time.Second, 50*time.Millisecond, "ready over TLS\n%s", lim.Log.String())
			id := redistest.Unique(t, "tls_http_bot")
			var allowed []bool
			for range 3 {
				body := fmt.Sprintf(`{"principal":{"kind":"bot","id":%q},"ip":"203.0.113.7","method":"POST","route":"/x","cost":1}`, id)
				resp, err := client.Post("https://"+addr+"/v1/check", "application/json", strings.NewReader(body))
				require.NoError(t, err)
				var d struct {
					Allowed bool `json:"allowed"`
				}
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
				resp.Body.Close()
				allowed = append(allowed, d.Allowed)
			}
			require.Equal(t, []bool{true, true, false}, allowed)
			resp, err := client.Get("https://" + addr + "/metrics")
			require.NoError(t, err)
			resp.Body.Close()
			require.Equal(t, http.StatusOK, resp.StatusCode, "metrics over TLS")

			resp, err = (&http.Client{Timeout: 3 * time.Second}).Get("http://" + addr + "/healthz")
			if err == nil {
				resp.Body.Close()
				require.NotEqual(t, http.StatusOK, resp.StatusCode, "plaintext is not served")
			}
		})
	}
}
