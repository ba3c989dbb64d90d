package envoyrls

import (
	"bytes"
	"context"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/h2guard/h2guardtest"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// transportEnv names the transport the wire tests serve on (grpc-go when
// unset); TestWireTestsOnTheFloodgateTransport runs them again on the
// other.
const transportEnv = "FLOODGATE_TEST_GRPC_TRANSPORT"

// dialService serves s on the test's transport over TCP and dials it with
// grpc-go's client.
func dialService(t testing.TB, s *server.Server, opts ...GRPCOption) (*grpc.ClientConn, *health.Server) {
	t.Helper()
	g, hs, err := NewTransportServer(os.Getenv(transportEnv), NewEnvoyRLS(s, opts...))
	require.NoError(t, err)
	_, conn := limitertest.ServeGRPC(t, g.Serve, func() {
		ctx, cancel := context.WithTimeout(context.Background(), time.Second)
		defer cancel()
		_ = g.Shutdown(ctx)
	})
	return conn, hs
}

// The Envoy tests over the wire (every one that serves through dialService)
// again, on pkg/grpcfast: the same answers, events, metrics and
// authentication from either transport.
func TestWireTestsOnTheFloodgateTransport(t *testing.T) {
	runAgain(t, transportEnv, TransportFloodgate, "^TestEnvoy", "TestEnvoyShouldRateLimitDecidesWithContractAndPublishes")
}

// runAgain runs this package's tests matching pattern again in a process of
// their own, with env set to val, and requires them to pass, the tests
// named by mustPass among them. It skips in that process itself, and with
// -short.
func runAgain(t *testing.T, env, val, pattern string, mustPass ...string) {
	t.Helper()
	if os.Getenv(env) != "" {
		t.Skip("this is the run with " + env + " set")
	}
	if testing.Short() {
		t.Skip("-short")
	}
	redistest.Client(t) // fails loudly without the stack, as the tests it runs
	cmd := exec.Command(os.Args[0], "-test.run="+pattern, "-test.count=1", "-test.v")
	cmd.Env = append(os.Environ(), env+"="+val)
	out, err := cmd.CombinedOutput()
	require.NoError(t, err, "%s", out)
	for _, name := range mustPass {
		require.Contains(t, string(out), "--- PASS: "+name, "with %s=%s", env, val)
	}
}

func TestTransportNames(t *testing.T) {
	s := server.New(server.Config{Engine: limitertest.Engine(t, redistest.Client(t), limitertest.OneBucket, nil),
		Publisher: &kafkatest.Capture{}, Topic: "decisions", Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	_, _, err := NewTransportServer("netty", NewEnvoyRLS(s))
	require.ErrorContains(t, err, `"netty"`)
	for _, name := range Transports {
		require.True(t, ValidTransport(name))
	}
	require.False(t, ValidTransport("grpc"))
}

// On the Floodgate transport a rapid-reset flood is sent GOAWAY
// (ENHANCE_YOUR_CALM) by pkg/h2guard, as on grpc-go, and health keeps
// answering; the entry gate lets calls through.
func TestFloodgateTransportGuardsAndGates(t *testing.T) {
	rdb := redistest.Client(t)
	reg := prometheus.NewRegistry()
	s := server.New(server.Config{Engine: limitertest.Engine(t, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000, period: 1s}\n", nil),
		Publisher: &kafkatest.Capture{}, Topic: "decisions", Logger: slog.New(slog.DiscardHandler), Registry: reg})
	g, hs := NewFastServer(s, WithGate(GateMin, 0, nil))
	SetServing(hs, true)
	addr, conn := limitertest.ServeGRPC(t, g.Serve, g.Close)
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()

	r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "edge",
		Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(redistest.Unique(t, "fast_bot"))}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_envoy_requests_total", map[string]string{"result": "ok"}))

	// A call whose grpc-timeout passed before its message came: answered
	// by the transport, counted as ShouldRateLimit counts it.
	require.Equal(t, "4", latePost(t, addr), "DEADLINE_EXCEEDED")
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_calls_dropped_past_deadline_total", map[string]string{"protocol": "grpc", "priority": "none"}))
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_envoy_requests_total", map[string]string{"result": "past_deadline"}))

	// A call its caller reset in the read that completed it: neither run
	// nor answered, counted as a call whose caller went away.
	resetPost(t, addr)
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_envoy_requests_total", map[string]string{"result": "canceled"}))
	require.Equal(t, 1.0, promtest.Value(t, reg, "floodgate_limiter_envoy_requests_total", map[string]string{"result": "ok"}), "not run")

	fctx, fcancel := context.WithTimeout(ctx, time.Second)
	defer fcancel()
	st := h2guardtest.Flood(fctx, addr, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName)
	require.Positive(t, st.Calm, "the flood was sent GOAWAY ENHANCE_YOUR_CALM: %+v", st)
	require.Positive(t, promtest.Value(t, reg, "floodgate_limiter_grpc_abuse_goaways_total", nil))

	hr, err := healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.GetStatus())
	_, err = healthpb.NewHealthClient(conn).List(ctx, &healthpb.HealthListRequest{})
	require.NotEqual(t, codes.Unavailable, status.Code(err), "a unary health method is served or refused, never dropped")
}

// rlsConn dials addr for a ShouldRateLimit call sent by hand: the preface
// is sent, fr reads and writes nc, and block is the call's header block,
// its grpc-timeout timeout.
func rlsConn(t *testing.T, addr, timeout string) (nc net.Conn, fr *http2.Framer, block []byte) {
	t.Helper()
	nc, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	t.Cleanup(func() { _ = nc.Close() })
	_ = nc.SetDeadline(time.Now().Add(5 * time.Second))
	fr = http2.NewFramer(nc, nc)
	fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
	_, err = nc.Write([]byte(http2.ClientPreface))
	require.NoError(t, err)
	require.NoError(t, fr.WriteSettings())
	var hb bytes.Buffer
	enc := hpack.NewEncoder(&hb)
	for _, kv := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", rlsv3.RateLimitService_ShouldRateLimit_FullMethodName},
		{":authority", "x"}, {"content-type", "application/grpc"}, {"grpc-timeout", timeout}} {
		require.NoError(t, enc.WriteField(hpack.HeaderField{Name: kv[0], Value: kv[1]}))
	}
	return nc, fr, hb.Bytes()
}

// resetPost sends ShouldRateLimit by hand, its caller's RST_STREAM and a
// PING in one write, and returns once the PING is acked; the call must
// not be answered.
func resetPost(t *testing.T, addr string) {
	t.Helper()
	nc, fr, block := rlsConn(t, addr, "1S")
	var b bytes.Buffer
	w := http2.NewFramer(&b, nil)
	require.NoError(t, w.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true}))
	require.NoError(t, w.WriteData(1, true, []byte{0, 0, 0, 0, 0}))
	require.NoError(t, w.WriteRSTStream(1, http2.ErrCodeCancel))
	require.NoError(t, w.WritePing(false, [8]byte{'r', 'e', 's', 'e', 't'}))
	_, err := nc.Write(b.Bytes()) // one segment: one read
	require.NoError(t, err)
	for {
		f, err := fr.ReadFrame()
		require.NoError(t, err)
		require.Zero(t, f.Header().StreamID, "the reset call answered: %v", f)
		if p, ok := f.(*http2.PingFrame); ok && p.IsAck() {
			return
		}
	}
}

// latePost sends ShouldRateLimit by hand with a grpc-timeout of 1 ms and its
// message 20 ms later, and returns the answer's grpc-status.
func latePost(t *testing.T, addr string) string {
	t.Helper()
	_, fr, block := rlsConn(t, addr, "1m")
	require.NoError(t, fr.WriteHeaders(http2.HeadersFrameParam{StreamID: 1, BlockFragment: block, EndHeaders: true}))
	time.Sleep(20 * time.Millisecond)
	require.NoError(t, fr.WriteData(1, true, []byte{0, 0, 0, 0, 0}))
	for {
		f, err := fr.ReadFrame()
		require.NoError(t, err)
		if mh, ok := f.(*http2.MetaHeadersFrame); ok && mh.StreamEnded() {
			for _, hf := range mh.Fields {
				if hf.Name == "grpc-status" {
					return hf.Value
				}
			}
			return ""
		}
	}
}

// Tracing on, either transport makes ShouldRateLimit otelgrpc's server span,
// the child of the traceparent Envoy sends, and traces no health check.
func TestTransportsTraceCalls(t *testing.T) {
	const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	rdb := redistest.Client(t)
	for _, name := range Transports {
		t.Run(name, func(t *testing.T) {
			rec := tracetest.NewSpanRecorder()
			tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
			s := server.New(server.Config{Engine: limitertest.Engine(t, rdb, limitertest.OneBucket, nil),
				Publisher: &kafkatest.Capture{}, Topic: "decisions", Logger: slog.New(slog.DiscardHandler),
				Registry: prometheus.NewRegistry(), Tracing: tracing.Tracing{Provider: tp}})
			s.SetReady(true)
			g, hs, err := NewTransportServer(name, NewEnvoyRLS(s))
			require.NoError(t, err)
			SetServing(hs, true)
			_, conn := limitertest.ServeGRPC(t, g.Serve, func() { _ = g.Shutdown(context.Background()) })
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			_, err = rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(
				metadata.AppendToOutgoingContext(ctx, "traceparent", "00-"+callerTrace+"-"+callerSpan+"-01"),
				&rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(redistest.Unique(t, "traced"))}})
			require.NoError(t, err)
			_, err = healthpb.NewHealthClient(conn).Check(ctx, &healthpb.HealthCheckRequest{})
			require.NoError(t, err)

			var got []sdktrace.ReadOnlySpan
			require.Eventually(t, func() bool {
				got = got[:0]
				for _, sp := range rec.Ended() {
					if sp.SpanKind() == trace.SpanKindServer {
						got = append(got, sp)
					}
				}
				return len(got) > 0
			}, 5*time.Second, 10*time.Millisecond)
			require.Len(t, got, 1, "one server span: the health check is not traced")
			sp := got[0]
			require.Equal(t, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName[1:], sp.Name())
			require.Equal(t, callerTrace, sp.SpanContext().TraceID().String())
			require.Equal(t, callerSpan, sp.Parent().SpanID().String())
			require.True(t, sp.Parent().IsRemote())
		})
	}
}

// The limiter's health Watch on either transport: the status, its change
// when the limiter stops being ready, and a drain that does not wait for
// the Watch (grpc-go's GracefulStop does: its Shutdown ends at the
// deadline, closing the stream).
func TestTransportsServeHealthWatch(t *testing.T) {
	rdb := redistest.Client(t)
	for _, name := range Transports {
		t.Run(name, func(t *testing.T) {
			s := server.New(server.Config{Engine: limitertest.Engine(t, rdb, limitertest.OneBucket, nil),
				Publisher: &kafkatest.Capture{}, Topic: "decisions", Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
			g, hs, err := NewTransportServer(name, NewEnvoyRLS(s))
			require.NoError(t, err)
			SetServing(hs, true)
			_, conn := limitertest.ServeGRPC(t, g.Serve, func() {})
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			w, err := healthpb.NewHealthClient(conn).Watch(ctx, &healthpb.HealthCheckRequest{Service: rlsv3.RateLimitService_ServiceDesc.ServiceName})
			require.NoError(t, err)
			r, err := w.Recv()
			require.NoError(t, err)
			require.Equal(t, healthpb.HealthCheckResponse_SERVING, r.GetStatus())
			hs.Shutdown() // the limiter, not ready
			r, err = w.Recv()
			require.NoError(t, err)
			require.Equal(t, healthpb.HealthCheckResponse_NOT_SERVING, r.GetStatus())

			sctx, scancel := context.WithTimeout(context.Background(), time.Second)
			defer scancel()
			start := time.Now()
			err = g.Shutdown(sctx)
			t.Logf("%s: Shutdown with a Watch open: %v after %v", name, err, time.Since(start).Round(time.Millisecond))
			if name == TransportFloodgate {
				require.NoError(t, err)
			}
			_, err = w.Recv()
			require.Equal(t, codes.Unavailable, status.Code(err))
		})
	}
}
