package config

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"syscall"
	"time"
)

// TransportMismatchError is a peer that speaks TLS on a port the client was
// configured to use in plaintext (PeerTLS), or plaintext where TLS is
// configured. Retrying does not help: the configuration must change, and
// Refusal names the variable.
type TransportMismatchError struct {
	Addr    string
	PeerTLS bool
}

func (e *TransportMismatchError) Error() string {
	if e.PeerTLS {
		return fmt.Sprintf("%s speaks TLS, the client plaintext", e.Addr)
	}
	return fmt.Sprintf("%s speaks plaintext, the client TLS", e.Addr)
}

// PlaintextProbe speaks the peer's protocol in plaintext on c (a Redis PING,
// a Kafka ApiVersions) and reports whether it answered in kind.
type PlaintextProbe func(ctx context.Context, c net.Conn) bool

// ProbeTransport explains a failed connection to addr (failure, made with TLS
// when tlsOn): it tries the other transport once, within timeout, and returns
// a *TransportMismatchError when the peer speaks that one. It returns nil
// when the peer refused the connection or did not answer the other way
// either — unreachable, not misconfigured.
func ProbeTransport(ctx context.Context, addr string, tlsOn bool, failure error, plain PlaintextProbe, timeout time.Duration) error {
	if failure == nil || errors.Is(failure, syscall.ECONNREFUSED) || errors.Is(failure, context.Canceled) {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	c, err := (&net.Dialer{}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil
	}
	defer c.Close()
	if d, ok := ctx.Deadline(); ok {
		_ = c.SetDeadline(d)
	}
	if tlsOn {
		if plain(ctx, c) {
			return &TransportMismatchError{Addr: addr}
		}
		return nil
	}
	// Only whether it speaks TLS: its certificate is not checked, and nothing
	// is sent after the handshake.
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12}) //nolint:gosec // a probe, not a connection
	err = tc.HandshakeContext(ctx)
	var alert tls.AlertError
	if err == nil || errors.As(err, &alert) {
		return &TransportMismatchError{Addr: addr, PeerTLS: true}
	}
	return nil
}
