package grpcfast

import (
	"context"
	"net"
	"sort"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	otelcodes "go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	testpb "google.golang.org/grpc/interop/grpc_testing"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/stats"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// serverSpan is what a test compares of a server span.
type serverSpan struct {
	Name      string
	Kind      trace.SpanKind
	Attrs     map[string]string // but server.port, which differs between servers
	Status    sdktrace.Status
	Parented  bool // the child of the client's span, from the call's metadata
	InHandler bool // the span the interceptor (and so the handler) saw
}

// servable is either server: grpc-go's or this package's.
type servable interface {
	grpc.ServiceRegistrar
	Serve(net.Listener) error
}

// tracedCalls serves the test service on the server newServer makes, with the limiter's tracing (pkg/tracing's otelgrpc handler)
// and an interceptor that notes the span in the call's context (and
// refuses a call with metadata "refuse"); it makes an OK call, a failed
// one, a refused one and a health check through a traced grpc-go client,
// and returns the server spans, sorted by status code.
func tracedCalls(t *testing.T, newServer func(sh stats.Handler, icpt grpc.UnaryServerInterceptor) (servable, func())) []serverSpan {
	t.Helper()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	prop := propagation.TraceContext{}
	var mu sync.Mutex
	seen := map[trace.SpanID]bool{}
	icpt := func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
		mu.Lock()
		seen[trace.SpanContextFromContext(ctx).SpanID()] = true
		mu.Unlock()
		if md, _ := metadata.FromIncomingContext(ctx); len(md.Get("refuse")) > 0 {
			return nil, status.Error(codes.Unavailable, "refused")
		}
		return h(ctx, req)
	}
	srv, stop := newServer(tracing.Tracing{Provider: tp, Propagator: prop}.GRPCStatsHandler(), icpt)
	testpb.RegisterTestServiceServer(srv, &testService{release: make(chan struct{}), started: make(chan struct{}, 1)})
	healthpb.RegisterHealthServer(srv, health.NewServer())
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(stop)
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithStatsHandler(otelgrpc.NewClientHandler(otelgrpc.WithTracerProvider(tp), otelgrpc.WithPropagators(prop))))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close() })
	c := testpb.NewTestServiceClient(conn)
	_, err = c.EmptyCall(ctxT(t), &testpb.Empty{})
	require.NoError(t, err)
	_, err = c.UnaryCall(ctxT(t), &testpb.SimpleRequest{Payload: &testpb.Payload{Body: []byte("fail")}})
	require.Equal(t, codes.FailedPrecondition, status.Code(err))
	_, err = c.EmptyCall(metadata.AppendToOutgoingContext(ctxT(t), "refuse", "1"), &testpb.Empty{})
	require.Equal(t, codes.Unavailable, status.Code(err))
	_, err = healthpb.NewHealthClient(conn).Check(ctxT(t), &healthpb.HealthCheckRequest{})
	require.NoError(t, err)

	var server []sdktrace.ReadOnlySpan
	client := map[trace.SpanID]bool{}
	require.Eventually(t, func() bool { // a server span ends after its answer is sent
		server = server[:0]
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindServer {
				server = append(server, s)
			} else {
				client[s.SpanContext().SpanID()] = true
			}
		}
		return len(server) == 3 && len(client) == 4
	}, 5*time.Second, 10*time.Millisecond, "three server spans (health checks are not traced) and four client spans")
	out := make([]serverSpan, 0, len(server))
	for _, s := range server {
		attrs := map[string]string{}
		for _, kv := range s.Attributes() {
			if kv.Key != "server.port" {
				attrs[string(kv.Key)] = kv.Value.Emit()
			}
		}
		mu.Lock()
		in := seen[s.SpanContext().SpanID()]
		mu.Unlock()
		out = append(out, serverSpan{Name: s.Name(), Kind: s.SpanKind(), Attrs: attrs, Status: s.Status(),
			Parented: s.Parent().IsRemote() && client[s.Parent().SpanID()], InHandler: in})
	}
	sort.Slice(out, func(i, j int) bool {
		return out[i].Attrs["rpc.response.status_code"] < out[j].Attrs["rpc.response.status_code"]
	})
	return out
}

// With a stats handler, every call is otelgrpc's server span as on grpc-go:
// the same name, kind, attributes and status, the child of the client's
// span, and in the handler's context.
func TestServerSpansAsGRPCGo(t *testing.T) {
	fast := tracedCalls(t, func(sh stats.Handler, icpt grpc.UnaryServerInterceptor) (servable, func()) {
		s := New(Config{StatsHandler: sh, Interceptor: icpt})
		return s, s.Close
	})
	grpcGo := tracedCalls(t, func(sh stats.Handler, icpt grpc.UnaryServerInterceptor) (servable, func()) {
		s := grpc.NewServer(grpc.StatsHandler(sh), grpc.UnaryInterceptor(icpt))
		return s, s.Stop
	})
	require.Equal(t, grpcGo, fast)

	want := []struct{ name, code string }{
		{"grpc.testing.TestService/UnaryCall", "FAILED_PRECONDITION"},
		{"grpc.testing.TestService/EmptyCall", "OK"},
		{"grpc.testing.TestService/EmptyCall", "UNAVAILABLE"},
	}
	for i, s := range fast {
		require.Equal(t, want[i].name, s.Name)
		require.Equal(t, trace.SpanKindServer, s.Kind)
		require.Equal(t, want[i].name, s.Attrs["rpc.method"])
		require.Equal(t, "grpc", s.Attrs["rpc.system.name"])
		require.Equal(t, want[i].code, s.Attrs["rpc.response.status_code"])
		require.Equal(t, "127.0.0.1", s.Attrs["server.address"])
		require.True(t, s.Parented, "the child of the client's span")
		require.True(t, s.InHandler, "in the handler's context")
	}
	require.Equal(t, sdktrace.Status{Code: otelcodes.Error, Description: "refused"}, fast[2].Status, "UNAVAILABLE is a server error")
	require.Zero(t, fast[0].Status.Code, "FAILED_PRECONDITION is the caller's error: status unset, as otelgrpc")
}
