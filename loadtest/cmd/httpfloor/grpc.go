package main

import (
	"context"
	"net"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"

	"github.com/floodgate-dev/floodgate/pkg/grpcfast"
)

// okRLS answers every ShouldRateLimit OK, one OK status per descriptor,
// and does nothing else: the floor of a gRPC rate-limit call.
type okRLS struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (okRLS) ShouldRateLimit(_ context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(in.GetDescriptors()))}
	for i := range out.Statuses {
		out.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	return out, nil
}

// serveGRPC serves okRLS on ln with grpc-go's defaults.
func serveGRPC(ln net.Listener) error {
	g := grpc.NewServer()
	rlsv3.RegisterRateLimitServiceServer(g, okRLS{})
	return g.Serve(ln)
}

// serveGRPCFast serves okRLS on ln with pkg/grpcfast, Floodgate's own
// HTTP/2 transport for unary gRPC: the floor of a call on it.
func serveGRPCFast(ln net.Listener) error {
	g := grpcfast.New(grpcfast.Config{})
	rlsv3.RegisterRateLimitServiceServer(g, okRLS{})
	return g.Serve(ln)
}
