// Package envoyclient dials the limiter's gRPC port as Envoy's rate-limit
// filter does on the wire, for the load generators: Dial gives a grpc-go
// client connection (peerbench), Wire a connection without grpc-go's
// client, for an open-loop generator with a thousand connections on one
// core (chaos overload-grpc).
//
// grpc-go's client estimates the connection's bandwidth-delay product: on
// every DATA frame it receives while no such ping is out it sends a PING,
// so each answer to a unary call costs the server a PING to read and an
// ack to write — over a thousand connections, a fifth of a limiter's CPU
// (docs/chaos.md, "The generator's pings"). Envoy's HTTP/2 codec has no
// such estimator: its flow-control windows are fixed
// (Http2ProtocolOptions initial_stream_window_size and
// initial_connection_window_size) and it sends PINGs only when
// connection_keepalive is configured, on an interval. A static window
// turns grpc-go's estimator off.
package envoyclient

import (
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
)

// Window is the static stream and connection flow-control window (1 MiB).
// Envoy's defaults are larger; for calls of a few hundred bytes the size
// makes no difference, only that it does not change.
const Window = 1 << 20

// Dial returns a client connection to addr (h2c) with a static window:
// no bandwidth-delay pings. It connects lazily, as grpc.NewClient does.
func Dial(addr string, opts ...grpc.DialOption) (*grpc.ClientConn, error) {
	return grpc.NewClient(addr, append([]grpc.DialOption{
		grpc.WithTransportCredentials(insecure.NewCredentials()),
		grpc.WithInitialWindowSize(Window), grpc.WithInitialConnWindowSize(Window),
	}, opts...)...)
}
