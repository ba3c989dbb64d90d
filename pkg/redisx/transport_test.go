package redisx_test

import (
	"context"
	"crypto/tls"
	"io"
	"log/slog"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// tlsOnlyServer accepts TLS connections (its certificate from ca) and reads
// until the client goes: a port that speaks TLS and nothing else.
func tlsOnlyServer(t *testing.T) string {
	t.Helper()
	ca := tlstest.NewCA(t, "tls-only")
	conf := tlstest.ServerConfig(ca.Server("tls-only"), nil)
	return tlstest.Peer(t, func(c net.Conn) {
		tc := tls.Server(c, conf)
		defer tc.Close()
		_ = tc.SetDeadline(time.Now().Add(5 * time.Second))
		_, _ = io.Copy(io.Discard, tc)
	})
}

// TestSecurityTransportMismatchT6 replays row 6 of issue 37 for Redis: a
// Redis endpoint speaking plaintext where TLS is configured, or TLS where
// plaintext is. On c2eb6a5 the service started and served degraded; now
// the start-up checks (WaitReady, CheckAccess) stop it at once with
// ErrAccess naming FLOODGATE_REDIS_TLS.
func TestSecurityTransportMismatchT6(t *testing.T) {
	redistest.Client(t)                                                                          // the local plaintext Redis
	plain := config.NewEnv(os.Getenv).List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs)[0] // as redistest dials it
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for _, tc := range []struct {
		name, addr string
		vars       map[string]string
		says       string
	}{
		{"TLS configured, the server plaintext", plain, map[string]string{"FLOODGATE_REDIS_TLS": "true"}, "speaks plaintext on this port, but FLOODGATE_REDIS_TLS is true"},
		{"plaintext configured, the server TLS", tlsOnlyServer(t), map[string]string{}, "speaks TLS on this port, but FLOODGATE_REDIS_TLS is not true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := secureClient(t, []string{tc.addr}, tc.vars)
			start := time.Now()
			err := redisx.WaitReady(ctx, c, slog.New(slog.DiscardHandler))
			require.ErrorIs(t, err, redisx.ErrAccess)
			require.ErrorContains(t, err, tc.says)
			require.Less(t, time.Since(start), 5*time.Second, "stopped at once, not waited for")
			cctx, ccancel := context.WithTimeout(ctx, 5*time.Second) // as the limiter and the console call it
			defer ccancel()
			err = redisx.CheckAccess(cctx, c)
			require.ErrorIs(t, err, redisx.ErrAccess, "CheckAccess (the limiter's and the console's) says the same")
			require.ErrorContains(t, err, "FLOODGATE_REDIS_TLS")
		})
	}
	t.Run("a server that is down is waited for, not refused", func(t *testing.T) {
		lis, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := lis.Addr().String()
		lis.Close()
		c := secureClient(t, []string{addr}, map[string]string{"FLOODGATE_REDIS_TLS": "true"})
		cctx, ccancel := context.WithTimeout(ctx, 5*time.Second)
		defer ccancel()
		require.NoError(t, redisx.CheckAccess(cctx, c))
	})
}
