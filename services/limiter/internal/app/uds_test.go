package app

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestGRPCOverAUnixSocket serves Envoy's rate-limit service on a unix socket
// (FLOODGATE_LIMITER_GRPC_ADDR=unix:PATH, envoy ratelimit's GRPC_UDS: Envoy
// beside the limiter in one pod) on both gRPC transports: answered, limits
// enforced, with no FLOODGATE_LIMITER_AUTH (only processes that may open the
// file reach it); the socket file goes when the limiter stops.
func TestGRPCOverAUnixSocket(t *testing.T) {
	redistest.Client(t)
	for _, transport := range []string{envoyrls.TransportFloodgate, envoyrls.TransportGRPCGo} {
		t.Run(transport, func(t *testing.T) {
			dir, err := os.MkdirTemp("", "fguds") // a socket path is at most 107 bytes
			require.NoError(t, err)
			t.Cleanup(func() { _ = os.RemoveAll(dir) })
			sock := filepath.Join(dir, "rls.sock")
			lim := startLimiter(t, map[string]string{
				"FLOODGATE_LIMITER_ADDR": stacktest.FreeAddr(t), "FLOODGATE_LIMITER_GRPC_ADDR": "unix:" + sock,
				"FLOODGATE_LIMITER_GRPC_TRANSPORT": transport, "FLOODGATE_GATEWAY": "uds-test",
				"FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "2", "FLOODGATE_LIMITER_PRINCIPAL_PERIOD": "1m", "FLOODGATE_LIMITER_INFLUX_INTERVAL": "0",
			})
			rls := rlsClient(t, t.Context(), "unix:"+sock, "envoy.service.ratelimit.v3.RateLimitService")
			requireTwoOfThree(t, t.Context(), rls, "uds_bot")
			require.Contains(t, lim.Log.String(), "grpc_addr=unix:"+sock, "the start line names the socket")
			require.NoError(t, lim.Stop())
			_, err = os.Stat(sock)
			require.True(t, os.IsNotExist(err), "the socket file is gone: %v", err)
		})
	}
}
