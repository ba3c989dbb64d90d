package envoyrls

// The two transports the rate-limit service runs on
// (FLOODGATE_LIMITER_GRPC_TRANSPORT): Floodgate's own h2c transport for
// unary calls (NewFastServer, pkg/grpcfast; the limiter's default), which
// costs a call about half of grpc-go's CPU, and grpc-go (NewGRPCServer).
// Both serve the same EnvoyRLS, the same health service and interceptors.

import (
	"cmp"
	"context"
	"fmt"
	"net"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"

	"github.com/floodgate-dev/floodgate/pkg/grpcfast"
	"github.com/floodgate-dev/floodgate/pkg/h2guard"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/rlscodec"
)

// The transports, by their configuration names.
const (
	TransportGRPCGo    = "grpc-go"
	TransportFloodgate = "floodgate"
)

// Transports are the names ValidTransport accepts.
var Transports = []string{TransportGRPCGo, TransportFloodgate}

// ValidTransport reports whether name is a transport.
func ValidTransport(name string) bool { return name == TransportGRPCGo || name == TransportFloodgate }

// GRPCServer is the rate-limit service's server on either transport.
type GRPCServer interface {
	// Serve accepts connections on ln until Shutdown.
	Serve(ln net.Listener) error
	// Shutdown stops accepting, lets the calls under way finish (GOAWAY)
	// and returns when they have, or closes every connection when ctx is
	// done first and returns ctx's error.
	Shutdown(ctx context.Context) error
}

// NewTransportServer returns rls on the named transport with its health
// service (NOT_SERVING until SetServing). The limiter's HTTP API serves the
// same rls on envoy ratelimit's /json (server.ServeEnvoyJSON).
func NewTransportServer(transport string, rls *EnvoyRLS) (GRPCServer, *health.Server, error) {
	switch transport {
	case TransportGRPCGo, "":
		g, hs := newGRPCServer(rls)
		return grpcGoServer{g}, hs, nil
	case TransportFloodgate:
		f, hs := newFastServer(rls)
		return f, hs, nil
	}
	return nil, nil, fmt.Errorf("gRPC transport %q: not one of %v", transport, Transports)
}

// grpcGoServer is a grpc.Server with Shutdown.
type grpcGoServer struct{ *grpc.Server }

func (g grpcGoServer) Shutdown(ctx context.Context) error {
	stopped := make(chan struct{})
	go func() { g.GracefulStop(); close(stopped) }()
	select {
	case <-stopped:
		return nil
	case <-ctx.Done():
		g.Stop()
		<-stopped
		return ctx.Err()
	}
}

// NewFastServer is NewGRPCServer on pkg/grpcfast: the same service, health,
// caller authentication (AuthInterceptor), entry gate (its door as the
// transport's tap), rapid-reset guard (pkg/h2guard on every connection),
// stream and message bounds, windows, connection age and idle limits,
// keepalive pings, health's Watch (a server-streaming method, which
// Shutdown ends where grpc-go's drain waits for it) and, tracing on,
// otelgrpc's server spans.
func NewFastServer(s *server.Server, opts ...GRPCOption) (*grpcfast.Server, *health.Server) {
	return newFastServer(NewEnvoyRLS(s, opts...))
}

func newFastServer(rls *EnvoyRLS) (*grpcfast.Server, *health.Server) {
	s := rls.s
	var reg prometheus.Registerer
	if r := s.Registry(); r != nil {
		reg = r
	}
	guard := h2guard.Credentials(insecure.NewCredentials(), h2guard.New(h2guard.Config{}, reg, "floodgate_limiter_grpc"))
	cfg := grpcfast.Config{
		MaxConcurrentStreams: cmp.Or(rls.maxStreams, MaxGRPCStreams),
		MaxRecvMsgSize:       1 << 20,
		Window:               grpcWindow,
		MaxConnectionIdle:    5 * time.Minute, MaxConnectionAge: 5 * time.Minute, MaxConnectionAgeGrace: 30 * time.Second,
		// grpc-go's keepalive defaults, which NewGRPCServer keeps: a
		// client silent for 2 h is pinged, and closed if it does not
		// answer within 20 s.
		KeepaliveTime: 2 * time.Hour, KeepaliveTimeout: 20 * time.Second,
		PingMinTime: 5 * time.Second,
		Codec:       rlscodec.Bytes{}, // as NewGRPCServer's
		// The guard admits (or tarpits) the connection and reads its
		// frames for resets past the budget.
		WrapConn: func(c net.Conn) net.Conn {
			gc, _, err := guard.ServerHandshake(c)
			if err != nil {
				return nil
			}
			return gc
		},
	}
	if cs := s.Callers(); cs != nil {
		cfg.Interceptor = cs.AuthInterceptor
	}
	cfg.StatsHandler = s.Tracing().GRPCStatsHandler() // server spans, tracing on (nil off)
	if rls.gate != nil {
		cfg.Tap = rls.gate.tap
		if rls.pace {
			cfg.ReadPacer = newPacer(rls.gate, ReadMaxWait, reg)
		}
	}
	// A call whose grpc-timeout passed before its message was read is
	// answered by the transport, as ShouldRateLimit would (counted the same
	// way), before a worker or the message decoding is spent on it.
	cfg.PastDeadline = func(method string) string {
		if method == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
			s.CountPastDeadline(server.ProtocolGRPC, "")
			rls.requests.WithLabelValues("past_deadline").Inc()
		}
		return server.DeadlineReason
	}
	// A call its caller reset before it was dispatched (under overload:
	// read after its deadline, with the caller's reset behind it) costs no
	// worker and no answer; it is counted as a call whose caller went away.
	cfg.Abandoned = func(method string) {
		if method == rlsv3.RateLimitService_ShouldRateLimit_FullMethodName {
			rls.requests.WithLabelValues("canceled").Inc()
		}
	}
	f := grpcfast.New(cfg)
	rlsv3.RegisterRateLimitServiceServer(f, rls)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(f, hs)
	SetServing(hs, false)
	return f, hs
}
