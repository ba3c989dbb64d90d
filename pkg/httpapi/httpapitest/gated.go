// Package httpapitest holds helpers for tests of HTTP servers at the
// connection level, below net/http.
package httpapitest

import (
	"net"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// GatedListener is a loopback listener that accepts only when told: a
// client's request (and its FIN) are in the socket before the server reads
// them, as under overload. Serve an http.Server on it, send with Send.
type GatedListener struct {
	net.Listener
	gate, done chan struct{}
	once       sync.Once
}

// NewGatedListener listens on a free loopback port; the server serving on it
// closes it.
func NewGatedListener(t testing.TB) *GatedListener {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return &GatedListener{Listener: ln, gate: make(chan struct{}), done: make(chan struct{})}
}

// Accept waits for Send to let a connection through, then accepts it.
func (l *GatedListener) Accept() (net.Conn, error) {
	select {
	case <-l.gate:
		return l.Listener.Accept()
	case <-l.done:
		return nil, net.ErrClosed
	}
}

// Close stops a waiting Accept and closes the listener.
func (l *GatedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// Send dials l and writes req; when leave is set the client then closes its
// writing side (it gave up) and waits for the FIN to cross loopback. Only
// then is the server let to accept the connection. It returns the client's
// side, closed when the test ends, to read the answer from.
func (l *GatedListener) Send(t testing.TB, req string, leave bool) net.Conn {
	t.Helper()
	c, err := net.Dial("tcp", l.Addr().String())
	require.NoError(t, err)
	t.Cleanup(func() { _ = c.Close() })
	_, err = c.Write([]byte(req))
	require.NoError(t, err)
	if leave {
		require.NoError(t, c.(*net.TCPConn).CloseWrite())
		time.Sleep(10 * time.Millisecond) // the FIN crosses loopback before the accept
	}
	l.gate <- struct{}{}
	return c
}
