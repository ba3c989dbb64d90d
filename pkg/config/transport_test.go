package config_test

import (
	"context"
	"crypto/tls"
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// tlsPeer serves TLS with conf on loopback and, like a Redis or a broker
// refusing a client after the handshake, resets every connection once its
// handshake is done (SO_LINGER 0). It returns the address.
func tlsPeer(t *testing.T, conf *tls.Config) string {
	t.Helper()
	return tlstest.Peer(t, func(c net.Conn) {
		_ = c.(*net.TCPConn).SetLinger(0)
		_ = tls.Server(c, conf).HandshakeContext(context.Background())
		_ = c.Close()
	})
}

// A TLS client with no certificate, refused by a reset instead of an alert
// (TLS 1.3's post-handshake refusal can reach it either way), learns that the
// peer wants a client certificate, and the refusal names the variables to set;
// a peer that asks for none, or a client that has one, is not explained so.
func TestProbeTransportFindsAMissingClientCertificate(t *testing.T) {
	ca := tlstest.NewCA(t, "probe")
	server := ca.Server("peer")
	reset := &net.OpError{Op: "read", Net: "tcp", Err: syscall.ECONNRESET}
	noPlain := func(context.Context, net.Conn) bool { return false }
	noCert := &tls.Config{RootCAs: ca.Pool(), MinVersion: tls.VersionTLS12}

	mtls := tlsPeer(t, tlstest.ServerConfig(server, ca.Pool()))
	err := config.ProbeTransport(context.Background(), mtls, noCert, reset, noPlain, 2*time.Second)
	var want *config.ClientCertRequiredError
	require.True(t, errors.As(err, &want), "got %v", err)
	require.Equal(t, mtls, want.Addr)
	why := config.RedisTLS().Refusal(err)
	require.Contains(t, why, "FLOODGATE_REDIS_TLS_CERT_FILE")
	require.Contains(t, why, "FLOODGATE_REDIS_TLS_KEY_FILE")
	require.Contains(t, config.KafkaTLS().Refusal(err), "FLOODGATE_KAFKA_TLS_CERT_FILE")

	client := ca.Client("app")
	withCert := noCert.Clone()
	withCert.Certificates = []tls.Certificate{client.TLS}
	require.NoError(t, config.ProbeTransport(context.Background(), mtls, withCert, reset, noPlain, 2*time.Second),
		"a client with a certificate is not told to set one")

	oneWay := tlsPeer(t, tlstest.ServerConfig(server, nil))
	require.NoError(t, config.ProbeTransport(context.Background(), oneWay, noCert, reset, noPlain, 2*time.Second),
		"a peer that asks for no client certificate is not a missing one")
}
