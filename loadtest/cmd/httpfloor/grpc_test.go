package main

import (
	"context"
	"net"
	"testing"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// The gRPC floor answers ShouldRateLimit over TCP OK, one OK status per
// descriptor and nothing else, as peerbench's floor must.
func TestGRPCFloorAnswersOK(t *testing.T) {
	for name, serve := range map[string]func(net.Listener) error{"grpc-go": serveGRPC, "grpcfast": serveGRPCFast} {
		t.Run(name, func(t *testing.T) { testFloor(t, serve) })
	}
}

func testFloor(t *testing.T, serve func(net.Listener) error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go func() { _ = serve(ln) }()
	conn, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { _ = conn.Close(); _ = ln.Close() })
	d := &rlcommon.RateLimitDescriptor{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: "u1"}}}
	r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(context.Background(),
		&rlsv3.RateLimitRequest{Domain: "bench", Descriptors: []*rlcommon.RateLimitDescriptor{d, d}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())
	require.Len(t, r.GetStatuses(), 2)
	for _, st := range r.GetStatuses() {
		require.Equal(t, rlsv3.RateLimitResponse_OK, st.GetCode())
		require.Nil(t, st.GetCurrentLimit())
	}
}
