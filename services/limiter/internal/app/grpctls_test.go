package app

import (
	"context"
	"crypto/tls"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/credentials/insecure"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

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
			d := &rlcommon.RateLimitDescriptor{}
			for _, kv := range [][2]string{{"principal_kind", "bot"}, {"principal_id", redistest.Unique(t, "tls_bot")},
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
