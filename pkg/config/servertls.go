package config

import (
	"context"
	"crypto/tls"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"
)

// ServerTLSVars names the variables of one listener's TLS: its certificate
// chain and key (both set: TLS; neither: plaintext), and for mutual TLS the
// CA its clients' certificates must chain to and, optionally, names of which
// a client certificate must carry one. A listener without mutual TLS leaves
// ClientCA and ClientSAN empty.
type ServerTLSVars struct {
	Cert, Key, ClientCA, ClientSAN string
}

// HandshakeTimeout bounds a TLS handshake: a client that connects and says
// nothing holds its connection no longer.
const HandshakeTimeout = 10 * time.Second

// certCheckEvery is how often the certificate's files are looked at for a
// new pair (a rotated Secret, cert-manager's renewal), at most.
const certCheckEvery = time.Second

// ServerTLS is a listener's TLS: a server certificate that is re-read when
// its files change, so a renewed certificate is served without a restart,
// and, for mutual TLS, verified client certificates.
type ServerTLS struct {
	cfg       *tls.Config
	certs     *certFiles
	handshake time.Duration // HandshakeTimeout; shorter in tests
}

// ServerTLS reads a listener's TLS from v; nil when neither certificate nor
// key is set (plaintext). proto is the one application protocol offered by
// ALPN ("h2" for gRPC, "http/1.1"). Files are read now, so a missing or
// malformed one stops start-up naming its variable. A client CA makes a
// client certificate required and verified; client names without a client
// CA are an error.
func (e *Env) ServerTLS(v ServerTLSVars, proto string) *ServerTLS {
	cert, key := e.String(v.Cert, ""), e.String(v.Key, "")
	var ca string
	var sans []string
	if v.ClientCA != "" {
		ca, sans = e.String(v.ClientCA, ""), e.List(v.ClientSAN, "")
	}
	if cert == "" && key == "" {
		const needTLS = "%s is set but %s and %s are not: client certificates need TLS"
		if ca != "" {
			e.errs = append(e.errs, fmt.Errorf(needTLS, v.ClientCA, v.Cert, v.Key))
		}
		if len(sans) > 0 {
			e.errs = append(e.errs, fmt.Errorf(needTLS, v.ClientSAN, v.Cert, v.Key))
		}
		return nil
	}
	if (cert == "") != (key == "") {
		e.errs = append(e.errs, fmt.Errorf("%s and %s: set both (the server's certificate and its key) or neither", v.Cert, v.Key))
		return nil
	}
	files := &certFiles{cert: cert, key: key, certVar: v.Cert, keyVar: v.Key}
	if err := files.load(); err != nil {
		e.errs = append(e.errs, err)
		return nil
	}
	c := &tls.Config{MinVersion: tls.VersionTLS12, NextProtos: []string{proto}, GetCertificate: files.get}
	if ca != "" {
		pool := e.caPool(v.ClientCA, ca)
		if pool == nil {
			return nil
		}
		c.ClientCAs, c.ClientAuth = pool, tls.RequireAndVerifyClientCert
	} else if len(sans) > 0 {
		e.errs = append(e.errs, fmt.Errorf("%s is set but %s is not: client names are checked on verified client certificates", v.ClientSAN, v.ClientCA))
		return nil
	}
	if len(sans) > 0 {
		c.VerifyConnection = func(cs tls.ConnectionState) error { return clientNamed(cs, sans) }
	}
	return &ServerTLS{cfg: c, certs: files, handshake: HandshakeTimeout}
}

// clientNamed accepts a verified client certificate that carries one of
// names as a DNS name, a URI (a SPIFFE id), an e-mail address or an IP
// address among its subject alternative names.
func clientNamed(cs tls.ConnectionState, names []string) error {
	if len(cs.PeerCertificates) == 0 {
		return fmt.Errorf("tls: no client certificate")
	}
	leaf := cs.PeerCertificates[0]
	has := slices.Clone(leaf.DNSNames)
	has = append(has, leaf.EmailAddresses...)
	for _, u := range leaf.URIs {
		has = append(has, u.String())
	}
	for _, ip := range leaf.IPAddresses {
		has = append(has, ip.String())
	}
	for _, n := range has {
		if slices.Contains(names, n) {
			return nil
		}
	}
	return fmt.Errorf("tls: the client certificate (%q) names none of the allowed clients", leaf.Subject.CommonName)
}

// Mode says what a start-up line should: "off" (plaintext, a nil
// ServerTLS), "tls", or "mutual" (client certificates verified).
func (s *ServerTLS) Mode() string {
	switch {
	case s == nil:
		return "off"
	case s.cfg.ClientAuth == tls.RequireAndVerifyClientCert:
		return "mutual"
	}
	return "tls"
}

// SetLogger sets where a failed reload of the certificate is logged
// (slog.Default otherwise).
func (s *ServerTLS) SetLogger(l *slog.Logger) {
	s.certs.mu.Lock()
	defer s.certs.mu.Unlock()
	s.certs.log = l
}

// Listener serves TLS on ln for a server that runs each handshake under
// its own read deadline, as net/http and fasthttp do; net/http's handlers
// see the connection's TLS state (Request.TLS). A *tls.Conn offers no
// socket below it (no Unwrap, no syscall.Conn), so nothing that reads a raw
// socket (read pacing, caller-gone checks) reads past TLS.
func (s *ServerTLS) Listener(ln net.Listener) net.Listener { return tls.NewListener(ln, s.cfg) }

// BoundedListener is Listener for a server that may read a new connection
// without a deadline (the gRPC transports): each connection's handshake
// runs on its first read or write, in the goroutine that serves it, bounded
// by HandshakeTimeout.
func (s *ServerTLS) BoundedListener(ln net.Listener) net.Listener {
	return &boundedListener{Listener: ln, cfg: s.cfg, timeout: s.handshake}
}

type boundedListener struct {
	net.Listener
	cfg     *tls.Config
	timeout time.Duration
}

func (l *boundedListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return &handshakeConn{Conn: tls.Server(c, l.cfg), timeout: l.timeout}, nil
}

// handshakeConn is a server-side TLS connection whose handshake is bounded
// by timeout.
type handshakeConn struct {
	*tls.Conn
	timeout time.Duration
	once    sync.Once
	err     error
}

func (c *handshakeConn) handshake() error {
	c.once.Do(func() {
		ctx, cancel := context.WithTimeout(context.Background(), c.timeout)
		defer cancel()
		c.err = c.HandshakeContext(ctx)
	})
	return c.err
}

func (c *handshakeConn) Read(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Read(b)
}

func (c *handshakeConn) Write(b []byte) (int, error) {
	if err := c.handshake(); err != nil {
		return 0, err
	}
	return c.Conn.Write(b)
}

// certFiles is a certificate and key on disk, re-read when either file
// changes (looked at once a second at most, on a handshake). A pair that
// fails to load keeps the one in use, and says so in the log.
type certFiles struct {
	cert, key, certVar, keyVar string
	log                        *slog.Logger

	mu      sync.Mutex
	pair    *tls.Certificate
	stamp   string // the files' sizes and modification times
	checked time.Time
	failed  string // the stamp that last failed to load: logged once
}

// fileStamp identifies the files' contents without reading them.
func (f *certFiles) fileStamp() (string, error) {
	var b strings.Builder
	for _, p := range []string{f.cert, f.key} {
		st, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		fmt.Fprintf(&b, "%d/%d;", st.Size(), st.ModTime().UnixNano())
	}
	return b.String(), nil
}

// load reads the pair; its error names the variables.
func (f *certFiles) load() error {
	stamp, _ := f.fileStamp()
	pair, err := tls.LoadX509KeyPair(f.cert, f.key)
	if err != nil {
		// LoadX509KeyPair's errors describe the files, never the key's bytes.
		return fmt.Errorf("%s=%q and %s=%q: %w", f.certVar, f.cert, f.keyVar, f.key, err)
	}
	f.pair, f.stamp = &pair, stamp
	return nil
}

func (f *certFiles) get(*tls.ClientHelloInfo) (*tls.Certificate, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if now := time.Now(); now.Sub(f.checked) >= certCheckEvery {
		f.checked = now
		if stamp, err := f.fileStamp(); err == nil && stamp != f.stamp && stamp != f.failed {
			if err := f.load(); err != nil {
				f.failed = stamp
				log := f.log
				if log == nil {
					log = slog.Default()
				}
				log.Error("TLS certificate not reloaded; the one loaded before is served", "err", err)
			}
		}
	}
	return f.pair, nil
}
