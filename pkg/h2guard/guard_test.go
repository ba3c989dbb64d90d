package h2guard_test

import (
	"context"
	"encoding/binary"
	"errors"
	"net"
	"os"
	"path/filepath"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate-dev/floodgate/pkg/h2guard"
	"github.com/floodgate-dev/floodgate/pkg/h2guard/h2guardtest"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
)

func serve(t *testing.T, reg prometheus.Registerer, cfg h2guard.Config) string {
	t.Helper()
	lis, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	serveOn(t, lis, reg, cfg)
	return lis.Addr().String()
}

func serveOn(t *testing.T, lis net.Listener, reg prometheus.Registerer, cfg h2guard.Config) {
	t.Helper()
	g := grpc.NewServer(grpc.MaxConcurrentStreams(1000),
		grpc.Creds(h2guard.Credentials(insecure.NewCredentials(), h2guard.New(cfg, reg, "test_grpc"))))
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	go func() { _ = g.Serve(lis) }()
	t.Cleanup(g.Stop)
}

func check(t *testing.T, conn *grpc.ClientConn) {
	t.Helper()
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	out, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, out.GetStatus())
}

// A rapid-reset client is sent GOAWAY (ENHANCE_YOUR_CALM) and closed, again
// on every connection it opens; callers beside it are served throughout.
func TestGuardAnswersRapidResetWithGoaway(t *testing.T) {
	reg := prometheus.NewRegistry()
	// The budget alone is under test: no reset is old enough to be a caller
	// that stopped waiting (MinLifetime), and the bucket barely refills. With
	// the defaults, a loaded machine (CI) read a flood's HEADERS and its RST
	// more than 10 ms apart, so resets spent no budget, and the one closed
	// connection had read 402 of them.
	const burst = 200
	addr := serve(t, reg, h2guard.Config{Cooldown: time.Second, Tarpit: 10 * time.Millisecond,
		ResetBurst: burst, ResetRate: 1, MinLifetime: time.Hour})
	conn, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { conn.Close() })
	check(t, conn)

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st := h2guardtest.Flood(ctx, addr, "/grpc.health.v1.Health/Check")
	t.Logf("1 s of rapid reset: %+v", st)
	// The server sends GOAWAY (ENHANCE_YOUR_CALM) and closes; the attacker's
	// reader sees it only when the frame is read before the close's RST
	// discards it (on a loaded machine it may not be), so the server's own
	// count is the measure, and the attacker had to reconnect.
	goaways := promtest.Counter(t, reg, "test_grpc_abuse_goaways_total")
	require.Positive(t, goaways, "GOAWAY with ENHANCE_YOUR_CALM sent")
	require.GreaterOrEqual(t, goaways, float64(st.Calm), "counted")
	require.Greater(t, st.Conns, int64(1), "the flooding connection was closed")
	// The attacker wrote far more into its socket than the server read: the
	// server stops reading a connection once its budget (200) is spent.
	resets := promtest.Counter(t, reg, "test_grpc_stream_resets_total")
	t.Logf("resets read by the server: %.0f on %.0f closed connections", resets, goaways)
	require.Less(t, resets/goaways, burst*1.25, "each connection is closed just past its budget")
	check(t, conn) // the well-behaved connection was never touched
	require.Positive(t, promtest.Counter(t, reg, "test_grpc_abuse_refused_connections_total"),
		"the flood's reconnections were closed at accept while its address cooled down")

	// New connections from the address are served again after the cool-down.
	time.Sleep(1100 * time.Millisecond)
	fresh, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { fresh.Close() })
	check(t, fresh)
}

// On a unix socket every client has the same (empty) address: a flooding
// connection is closed as on TCP, but no address is banned, so the
// socket's other clients keep connecting.
func TestGuardOnAUnixSocketBansNoOne(t *testing.T) {
	reg := prometheus.NewRegistry()
	dir, err := os.MkdirTemp("", "h2g")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "g.sock")
	lis, err := net.Listen("unix", path)
	require.NoError(t, err)
	serveOn(t, lis, reg, h2guard.Config{Cooldown: time.Hour, Tarpit: 10 * time.Millisecond, ResetBurst: 200, ResetRate: 1, MinLifetime: time.Hour})

	ctx, cancel := context.WithTimeout(context.Background(), time.Second)
	defer cancel()
	st := h2guardtest.Flood(ctx, "unix:"+path, "/grpc.health.v1.Health/Check")
	t.Logf("1 s of rapid reset over a unix socket: %+v", st)
	require.Positive(t, promtest.Counter(t, reg, "test_grpc_abuse_goaways_total"), "the flooding connection was closed")
	require.Greater(t, st.Conns, int64(1))
	require.Zero(t, promtest.Counter(t, reg, "test_grpc_abuse_refused_connections_total"), "no connection refused for its address")
	fresh, err := grpc.NewClient("unix:"+path, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { fresh.Close() })
	check(t, fresh) // within the hour-long cool-down a TCP address would have
}

// Envoy resets calls it stopped waiting for: a connection with many
// cancellations, but fewer than half of its streams, is never closed.
func TestGuardSparesCancellingClients(t *testing.T) {
	now := time.Unix(0, 0)
	g := h2guard.New(h2guard.Config{ResetBurst: 10, ResetRate: 1, Now: func() time.Time { return now }}, nil, "t")
	for _, tc := range []struct {
		name       string
		every      int // one reset per this many streams
		wantClosed bool
	}{
		{"a third of the streams reset", 3, false},
		{"every stream reset", 1, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			client, server := net.Pipe()
			defer client.Close()
			c := g.Conn(server)
			var abused atomic.Bool
			go func() { // the server's side reads
				buf := make([]byte, 4096)
				for {
					if _, err := c.Read(buf); err != nil {
						abused.Store(errors.Is(err, h2guard.ErrAbuse))
						return
					}
				}
			}()
			go func() { // and drains what the guard writes (its GOAWAY)
				buf := make([]byte, 4096)
				for {
					if _, err := client.Read(buf); err != nil {
						return
					}
				}
			}()
			closed := false
			_, err := client.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
			require.NoError(t, err)
			for i := 1; i <= 600 && !closed; i++ {
				id := uint32(2*i + 1)
				frames := binary.BigEndian.AppendUint32([]byte{0, 0, 0, 0x1, 0x4}, id) // empty HEADERS, END_HEADERS
				if i%tc.every == 0 {
					frames = binary.BigEndian.AppendUint32(append(frames, 0, 0, 4, 0x3, 0), id) // RST_STREAM
					frames = append(frames, 0, 0, 0, 8)                                         // CANCEL
				}
				_, _ = client.Write(frames)
				closed = abused.Load()
			}
			time.Sleep(50 * time.Millisecond)
			closed = abused.Load()
			require.Equal(t, tc.wantClosed, closed)
		})
	}
}

// A caller that gives up on calls it waited for (its deadline passed while
// the server was busy) resets every stream, and is never closed: only a
// reset within MinLifetime of the stream's opening is a rapid reset. The
// same frames with no time between opening and reset are.
func TestGuardSparesCallersPastTheirDeadline(t *testing.T) {
	for _, tc := range []struct {
		name       string
		waited     time.Duration
		wantClosed bool
	}{
		{"reset after waiting 20 ms", 20 * time.Millisecond, false},
		{"reset at once", 0, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var clock atomic.Int64
			g := h2guard.New(h2guard.Config{ResetBurst: 10, ResetRate: 1, MinLifetime: 10 * time.Millisecond,
				Now: func() time.Time { return time.Unix(0, clock.Load()) }}, nil, "t")
			client, server := net.Pipe()
			defer client.Close()
			c := g.Conn(server)
			var abused atomic.Bool
			go func() {
				buf := make([]byte, 1<<16)
				for {
					if _, err := c.Read(buf); err != nil {
						abused.Store(errors.Is(err, h2guard.ErrAbuse))
						return
					}
				}
			}()
			go func() {
				buf := make([]byte, 4096)
				for {
					if _, err := client.Read(buf); err != nil {
						return
					}
				}
			}()
			// net.Pipe hands bytes to one Read at a time: once the PING after
			// a batch is taken, the guard has judged the batch before it.
			ping := append([]byte{0, 0, 8, 0x6, 0, 0, 0, 0, 0}, make([]byte, 8)...)
			var opens, resets []byte
			for i := 1; i <= 600; i++ {
				id := uint32(2*i + 1)
				opens = binary.BigEndian.AppendUint32(append(opens, 0, 0, 0, 0x1, 0x4), id)
				resets = binary.BigEndian.AppendUint32(append(resets, 0, 0, 4, 0x3, 0), id)
				resets = append(resets, 0, 0, 0, 8) // CANCEL
			}
			_, err := client.Write([]byte("PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"))
			require.NoError(t, err)
			_, err = client.Write(append(opens, ping...))
			require.NoError(t, err)
			_, err = client.Write(ping)
			require.NoError(t, err)
			clock.Add(int64(tc.waited))
			_, _ = client.Write(resets)
			_, _ = client.Write(ping)
			time.Sleep(50 * time.Millisecond)
			require.Equal(t, tc.wantClosed, abused.Load())
		})
	}
}
