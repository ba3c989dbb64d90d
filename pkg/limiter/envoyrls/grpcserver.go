package envoyrls

// The gRPC server the rate-limit service runs on: its bounds, windows,
// workers, rapid-reset guard and health.

import (
	"cmp"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/keepalive"

	"github.com/floodgate-dev/floodgate/pkg/h2guard"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/rlscodec"
)

// MaxGRPCStreams is the most concurrent streams one gRPC connection may hold.
const MaxGRPCStreams = 1000

// grpcStreamWorkers is how many goroutines serve gRPC streams for good. A
// call beyond them runs on a new goroutine whose stack grows on the way in
// (runtime.newstack): at 256 calls in flight, 128 workers left 4 % of the
// limiter's CPU to that, 256 left 0.75 % (docs/benchmarks.md). Each worker
// keeps a stack of a few KiB. grpcfast keeps its own default (128): past
// its workers a call starts a spare worker that stays for further calls,
// not a goroutine of its own.
const grpcStreamWorkers = 256

// grpcWindow is the static HTTP/2 flow-control window, per stream and per
// connection.
const grpcWindow = 1 << 20

// NewGRPCServer returns a gRPC server with Envoy's rate-limit service on s and
// the standard health service. Health reports SERVING (for "" and for
// envoy.service.ratelimit.v3.RateLimitService) once SetServing(hs, true) is called.
func NewGRPCServer(s *server.Server, opts ...GRPCOption) (*grpc.Server, *health.Server) {
	return newGRPCServer(NewEnvoyRLS(s, opts...))
}

func newGRPCServer(rls *EnvoyRLS) (*grpc.Server, *health.Server) {
	s := rls.s
	var reg prometheus.Registerer // the reset guard's counters; none without a registry
	if r := s.Registry(); r != nil {
		reg = r
	}
	// Envoy keeps HTTP/2 connections open indefinitely; a bounded connection age
	// makes clients reconnect now and then, so limiter replicas added by the
	// autoscaler receive their share of checks.
	// Bounded: at most 1,000 concurrent streams per connection (on main one
	// connection held 5,000), idle connections closed after 5 minutes, and
	// clients pinging more often than every 5 s are sent away.
	gopts := []grpc.ServerOption{grpc.MaxRecvMsgSize(1 << 20), grpc.MaxConcurrentStreams(cmp.Or(rls.maxStreams, MaxGRPCStreams)),
		grpc.KeepaliveParams(keepalive.ServerParameters{
			MaxConnectionAge: 5 * time.Minute, MaxConnectionAgeGrace: 30 * time.Second, MaxConnectionIdle: 5 * time.Minute,
		}),
		grpc.KeepaliveEnforcementPolicy(keepalive.EnforcementPolicy{MinTime: 5 * time.Second, PermitWithoutStream: true}),
		// Streams run on long-lived workers, whose stacks have grown to what a
		// call needs, instead of a new goroutine per call that grows its stack
		// again (12 % of the CPU profile at saturation); beyond them a stream
		// gets its own goroutine as before.
		grpc.NumStreamWorkers(grpcStreamWorkers),
		// Static flow-control windows (1 MiB per stream and connection)
		// turn off grpc-go's BDP estimator, which otherwise PINGs the
		// client on every DATA frame received while no ping is out — at
		// saturation, a frame written and one read for every few calls;
		// rate-limit calls are a few hundred bytes, so the windows never
		// bind.
		grpc.InitialWindowSize(grpcWindow), grpc.InitialConnWindowSize(grpcWindow),
		// Rapid reset (CVE-2023-44487; issue 37): a connection resetting
		// streams past its budget is sent GOAWAY and closed (pkg/h2guard).
		grpc.Creds(h2guard.Credentials(insecure.NewCredentials(), h2guard.New(h2guard.Config{}, reg, "floodgate_limiter_grpc"))),
		// Requests decoded and answers encoded by hand (pkg/rlscodec),
		// every other message by grpc-go's proto codec; on this server
		// only, and without a lookup by content-subtype per message.
		grpc.ForceServerCodecV2(rlscodec.NewCodec()),
	}
	if cs := s.Callers(); cs != nil {
		gopts = append(gopts, grpc.UnaryInterceptor(cs.AuthInterceptor))
	}
	gopts = append(gopts, s.Tracing().GRPCServerOptions()...) // server spans, tracing on
	if rls.gate != nil {
		gopts = append(gopts, grpc.InTapHandle(rls.gate.tap))
	}
	g := grpc.NewServer(gopts...)
	rlsv3.RegisterRateLimitServiceServer(g, rls)
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	SetServing(hs, false)
	return g, hs
}

// SetServing flips the gRPC health of the limiter's services.
func SetServing(hs *health.Server, ok bool) {
	st := healthpb.HealthCheckResponse_NOT_SERVING
	if ok {
		st = healthpb.HealthCheckResponse_SERVING
	}
	hs.SetServingStatus("", st)
	hs.SetServingStatus(rlsv3.RateLimitService_ServiceDesc.ServiceName, st)
}
