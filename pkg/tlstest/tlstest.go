// Package tlstest makes throwaway certificate authorities and certificates
// for tests of TLS connections (Redis, Kafka): a CA, server certificates for
// loopback names, and client certificates for mutual TLS, written as PEM
// files into t.TempDir() where servers and the FLOODGATE_*_TLS_* variables
// can point.
package tlstest

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"testing"
	"time"
)

// CA is a certificate authority that lives for one test.
type CA struct {
	t      testing.TB
	dir    string
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial int64
	// CertFile is the CA certificate as PEM (what FLOODGATE_*_TLS_CA_FILE names).
	CertFile string
}

// Pair is a certificate and its key as PEM files, and loaded.
type Pair struct {
	CertFile, KeyFile string
	TLS               tls.Certificate
}

// NewCA makes a CA named name (the subject's common name).
func NewCA(t testing.TB, name string) *CA {
	t.Helper()
	key := newKey(t)
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Hour),
		NotAfter:              time.Now().Add(24 * time.Hour),
		KeyUsage:              x509.KeyUsageCertSign | x509.KeyUsageCRLSign,
		BasicConstraintsValid: true,
		IsCA:                  true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		t.Fatalf("tlstest: create CA: %v", err)
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		t.Fatalf("tlstest: parse CA: %v", err)
	}
	ca := &CA{t: t, dir: t.TempDir(), cert: cert, key: key, serial: 1}
	ca.CertFile = ca.write(name+"-ca.pem", "CERTIFICATE", der)
	return ca
}

// Pool is a pool holding only this CA.
func (ca *CA) Pool() *x509.CertPool {
	p := x509.NewCertPool()
	p.AddCert(ca.cert)
	return p
}

// Server issues a server certificate for 127.0.0.1, ::1, localhost and the
// extra DNS names. It is good for client authentication too, as servers
// that dial each other (a Redis Cluster's bus, replication) present it.
func (ca *CA) Server(name string, dnsNames ...string) Pair {
	ca.t.Helper()
	return ca.issue(name, []x509.ExtKeyUsage{x509.ExtKeyUsageServerAuth, x509.ExtKeyUsageClientAuth}, append([]string{"localhost"}, dnsNames...),
		[]net.IP{net.IPv4(127, 0, 0, 1), net.IPv6loopback})
}

// Client issues a client certificate (mutual TLS) whose common name is name.
func (ca *CA) Client(name string) Pair {
	ca.t.Helper()
	return ca.issue(name, []x509.ExtKeyUsage{x509.ExtKeyUsageClientAuth}, nil, nil)
}

// ServerConfig is a server's TLS configuration with pair; clientCAs, when
// not nil, makes client certificates required and verified against it.
func ServerConfig(pair Pair, clientCAs *x509.CertPool) *tls.Config {
	c := &tls.Config{Certificates: []tls.Certificate{pair.TLS}, MinVersion: tls.VersionTLS12}
	if clientCAs != nil {
		c.ClientCAs, c.ClientAuth = clientCAs, tls.RequireAndVerifyClientCert
	}
	return c
}

func (ca *CA) issue(name string, usage []x509.ExtKeyUsage, dns []string, ips []net.IP) Pair {
	ca.t.Helper()
	ca.serial++
	key := newKey(ca.t)
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Hour),
		NotAfter:     time.Now().Add(24 * time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  usage,
		DNSNames:     dns,
		IPAddresses:  ips,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		ca.t.Fatalf("tlstest: issue %s: %v", name, err)
	}
	keyDER, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		ca.t.Fatalf("tlstest: marshal key: %v", err)
	}
	p := Pair{
		CertFile: ca.write(name+".pem", "CERTIFICATE", der),
		KeyFile:  ca.write(name+"-key.pem", "EC PRIVATE KEY", keyDER),
	}
	if p.TLS, err = tls.LoadX509KeyPair(p.CertFile, p.KeyFile); err != nil {
		ca.t.Fatalf("tlstest: load %s: %v", name, err)
	}
	return p
}

func (ca *CA) write(name, kind string, der []byte) string {
	ca.t.Helper()
	path := filepath.Join(ca.dir, name)
	// 0600: redis-server refuses nothing here, but keys should never be world-readable.
	if err := os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: kind, Bytes: der}), 0o600); err != nil {
		ca.t.Fatalf("tlstest: write %s: %v", path, err)
	}
	return path
}

func newKey(t testing.TB) *ecdsa.PrivateKey {
	t.Helper()
	k, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		t.Fatalf("tlstest: key: %v", err)
	}
	return k
}
