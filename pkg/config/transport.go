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

// ClientCertRequiredError is a TLS peer that asks for a client certificate
// of a client configured with none. With TLS 1.3 the peer refuses after the
// handshake, and its alert can reach the client as a reset or EOF instead of
// "certificate required" (the peer closes with the client's data unread), so
// the refusal is learnt from the handshake's CertificateRequest instead.
type ClientCertRequiredError struct{ Addr string }

func (e *ClientCertRequiredError) Error() string {
	return fmt.Sprintf("%s asks for a client certificate and the client has none", e.Addr)
}

// ProbeTransport explains a failed connection to addr (failure, made with
// TLS when conf is not nil, in plaintext when it is): it tries the other
// transport once, within timeout, and returns a *TransportMismatchError when
// the peer speaks that one, or, for a TLS client with no certificate whose
// peer speaks TLS, a *ClientCertRequiredError when the peer asks for one. It
// returns nil when the peer refused the connection or did not answer the
// other way either — unreachable, not misconfigured.
func ProbeTransport(ctx context.Context, addr string, conf *tls.Config, failure error, plain PlaintextProbe, timeout time.Duration) error {
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
	if conf != nil {
		if plain(ctx, c) {
			return &TransportMismatchError{Addr: addr}
		}
		if len(conf.Certificates) > 0 || conf.GetClientCertificate != nil {
			return nil
		}
		return askedForCert(ctx, addr, timeout)
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

// askedForCert dials addr once more and reports a *ClientCertRequiredError
// when its TLS handshake carries a CertificateRequest: the peer wants a client
// certificate. Only that is learnt: the peer's certificate is not checked and
// nothing is sent after the handshake.
func askedForCert(ctx context.Context, addr string, timeout time.Duration) error {
	c, err := (&net.Dialer{Timeout: timeout}).DialContext(ctx, "tcp", addr)
	if err != nil {
		return nil
	}
	defer c.Close()
	asked := false
	tc := tls.Client(c, &tls.Config{InsecureSkipVerify: true, MinVersion: tls.VersionTLS12, //nolint:gosec // a probe, not a connection
		GetClientCertificate: func(*tls.CertificateRequestInfo) (*tls.Certificate, error) {
			asked = true
			return &tls.Certificate{}, nil // none: the peer decides
		}})
	_ = tc.HandshakeContext(ctx)
	if asked {
		return &ClientCertRequiredError{Addr: addr}
	}
	return nil
}
