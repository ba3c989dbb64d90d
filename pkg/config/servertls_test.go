package config

import (
	"bytes"
	"crypto/tls"
	"crypto/x509"
	"io"
	"log/slog"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

var testTLSVars = ServerTLSVars{Cert: "T_CERT", Key: "T_KEY", ClientCA: "T_CLIENT_CA", ClientSAN: "T_CLIENT_SAN"}

func serverTLS(t *testing.T, vars map[string]string) (*ServerTLS, error) {
	t.Helper()
	e := NewEnv(func(k string) string { return vars[k] })
	s := e.ServerTLS(testTLSVars, "h2")
	return s, e.Err()
}

// TestServerTLSVariables: plaintext without a certificate; every mistake
// stops start-up naming its variable.
func TestServerTLSVariables(t *testing.T) {
	ca := tlstest.NewCA(t, "vars")
	pair := ca.Server("limiter")
	garbage := filepath.Join(t.TempDir(), "garbage.pem")
	require.NoError(t, os.WriteFile(garbage, []byte("not a certificate"), 0o600))
	s, err := serverTLS(t, nil)
	require.NoError(t, err)
	require.Nil(t, s, "plaintext")
	for _, c := range []struct {
		name string
		vars map[string]string
		want string
	}{
		{"a certificate without its key", map[string]string{"T_CERT": pair.CertFile}, "T_CERT and T_KEY: set both"},
		{"a client CA without TLS", map[string]string{"T_CLIENT_CA": ca.CertFile}, "T_CLIENT_CA is set but T_CERT and T_KEY are not"},
		{"client names without TLS", map[string]string{"T_CLIENT_SAN": "gw"}, "T_CLIENT_SAN is set but T_CERT and T_KEY are not"},
		{"client names without a client CA", map[string]string{"T_CERT": pair.CertFile, "T_KEY": pair.KeyFile, "T_CLIENT_SAN": "gw"}, "T_CLIENT_SAN is set but T_CLIENT_CA is not"},
		{"a missing key file", map[string]string{"T_CERT": pair.CertFile, "T_KEY": "/nonexistent/key.pem"}, `T_KEY="/nonexistent/key.pem"`},
		{"a key that is not one", map[string]string{"T_CERT": pair.CertFile, "T_KEY": garbage}, "T_CERT="},
		{"a client CA that is not one", map[string]string{"T_CERT": pair.CertFile, "T_KEY": pair.KeyFile, "T_CLIENT_CA": garbage}, "T_CLIENT_CA=" + `"` + garbage + `": no PEM certificate`},
	} {
		t.Run(c.name, func(t *testing.T) {
			_, err := serverTLS(t, c.vars)
			require.ErrorContains(t, err, c.want)
		})
	}
}

// serve accepts on s's listener and echoes what each connection sends.
func serve(t *testing.T, s *ServerTLS) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	tl := s.BoundedListener(ln)
	t.Cleanup(func() { _ = tl.Close() })
	go func() {
		for {
			c, err := tl.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_, _ = io.Copy(c, c)
			}()
		}
	}()
	return ln.Addr().String()
}

// dial completes a handshake and one echo, and returns the server's leaf.
func dial(addr string, cfg *tls.Config) (*x509.Certificate, error) {
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 5 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return nil, err
	}
	defer c.Close()
	_ = c.SetDeadline(time.Now().Add(5 * time.Second))
	if _, err := c.Write([]byte("ping")); err != nil {
		return nil, err
	}
	b := make([]byte, 4)
	if _, err := io.ReadFull(c, b); err != nil {
		return nil, err
	}
	return c.ConnectionState().PeerCertificates[0], nil
}

// TestServerTLSServesReloadsAndKeepsAGoodPair: the listener serves its
// certificate with ALPN; a renewed pair written over the files is served
// from the next handshake a second later, without a restart; a broken one
// keeps the pair in use and says so once.
func TestServerTLSServesReloadsAndKeepsAGoodPair(t *testing.T) {
	ca := tlstest.NewCA(t, "reload")
	first, renewed := ca.Server("limiter"), ca.Server("limiter-renewed")
	dir := t.TempDir()
	certFile, keyFile := filepath.Join(dir, "tls.crt"), filepath.Join(dir, "tls.key")
	copyFile := func(from, to string) {
		b, err := os.ReadFile(from)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(to+".tmp", b, 0o600))
		require.NoError(t, os.Rename(to+".tmp", to)) // as a mounted Secret's files change: all at once
	}
	copyFile(first.CertFile, certFile)
	copyFile(first.KeyFile, keyFile)
	s, err := serverTLS(t, map[string]string{"T_CERT": certFile, "T_KEY": keyFile})
	require.NoError(t, err)
	var logs bytes.Buffer
	s.SetLogger(slog.New(slog.NewTextHandler(&logs, nil)))
	addr := serve(t, s)
	client := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost", NextProtos: []string{"h2"}}

	leaf, err := dial(addr, client)
	require.NoError(t, err)
	require.Equal(t, "limiter", leaf.Subject.CommonName)
	c, err := tls.Dial("tcp", addr, client)
	require.NoError(t, err)
	require.Equal(t, "h2", c.ConnectionState().NegotiatedProtocol)
	_ = c.Close()
	_, err = dial(addr, &tls.Config{RootCAs: x509.NewCertPool(), ServerName: "localhost"})
	require.Error(t, err, "a client that does not trust the CA")

	copyFile(renewed.CertFile, certFile)
	copyFile(renewed.KeyFile, keyFile)
	require.Eventually(t, func() bool {
		leaf, err := dial(addr, client)
		return err == nil && leaf.Subject.CommonName == "limiter-renewed"
	}, 5*time.Second, 100*time.Millisecond, "the renewed certificate is served")

	require.NoError(t, os.WriteFile(keyFile, []byte("half-written"), 0o600))
	time.Sleep(certCheckEvery + 100*time.Millisecond)
	for range 3 {
		leaf, err = dial(addr, client)
		require.NoError(t, err, "a broken pair on disk keeps the good one served")
		require.Equal(t, "limiter-renewed", leaf.Subject.CommonName)
	}
	require.Equal(t, 1, bytes.Count(logs.Bytes(), []byte("TLS certificate not reloaded")), "said once: %s", logs.String())
	require.Contains(t, logs.String(), "T_KEY=")
}

// TestServerTLSMutual: with a client CA a client must present a
// certificate it signed; with client names, one carrying one of them.
func TestServerTLSMutual(t *testing.T) {
	ca, other := tlstest.NewCA(t, "mutual"), tlstest.NewCA(t, "other")
	server := ca.Server("limiter")
	named := ca.Server("gateway", "gateway.example") // carries the DNS name gateway.example, good for client auth
	unnamed := ca.Client("gateway-without-names")
	stranger := other.Server("gateway", "gateway.example")
	base := map[string]string{"T_CERT": server.CertFile, "T_KEY": server.KeyFile, "T_CLIENT_CA": ca.CertFile}
	with := func(pair *tlstest.Pair) *tls.Config {
		c := &tls.Config{RootCAs: ca.Pool(), ServerName: "localhost"}
		if pair != nil {
			c.Certificates = []tls.Certificate{pair.TLS}
		}
		return c
	}

	s, err := serverTLS(t, base)
	require.NoError(t, err)
	addr := serve(t, s)
	_, err = dial(addr, with(nil))
	require.Error(t, err, "no client certificate")
	_, err = dial(addr, with(&stranger))
	require.Error(t, err, "a certificate another CA signed")
	_, err = dial(addr, with(&unnamed))
	require.NoError(t, err, "any certificate the CA signed")

	base["T_CLIENT_SAN"] = "spiffe://cluster.local/ns/edge/sa/envoy, gateway.example"
	s, err = serverTLS(t, base)
	require.NoError(t, err)
	addr = serve(t, s)
	_, err = dial(addr, with(&unnamed))
	require.Error(t, err, "signed, but named none of the allowed clients")
	_, err = dial(addr, with(&named))
	require.NoError(t, err, "signed and named")
}

// TestServerTLSHandshakeTimeout: a client that connects and says nothing
// is let go once the handshake's time is up.
func TestServerTLSHandshakeTimeout(t *testing.T) {
	ca := tlstest.NewCA(t, "silent")
	pair := ca.Server("limiter")
	s, err := serverTLS(t, map[string]string{"T_CERT": pair.CertFile, "T_KEY": pair.KeyFile})
	require.NoError(t, err)
	s.handshake = 200 * time.Millisecond
	addr := serve(t, s)
	c, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer c.Close()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
	start := time.Now()
	_, err = c.Read(make([]byte, 1))
	require.Error(t, err, "closed by the server")
	require.ErrorIs(t, err, io.EOF)
	require.Less(t, time.Since(start), 3*time.Second, "let go at the handshake's timeout, not the client's read deadline")
}
