package httpapi

import (
	"bufio"
	"net"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// gatedListener accepts only when told: a client's request (and its FIN)
// are in the socket before the server reads them, as under overload.
type gatedListener struct {
	net.Listener
	gate, done chan struct{}
	once       sync.Once
}

func newGatedListener(t *testing.T) *gatedListener {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	return &gatedListener{Listener: ln, gate: make(chan struct{}), done: make(chan struct{})}
}

func (l *gatedListener) Accept() (net.Conn, error) {
	select {
	case <-l.gate:
		return l.Listener.Accept()
	case <-l.done:
		return nil, net.ErrClosed
	}
}

func (l *gatedListener) Close() error {
	l.once.Do(func() { close(l.done) })
	return l.Listener.Close()
}

// TestCallerGone: a caller that sent its request and then closed its side
// before the server read it is gone; one that still waits is not.
func TestCallerGone(t *testing.T) {
	gl := newGatedListener(t)
	gone := make(chan bool, 2)
	srv := DefaultServerConfig().NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gone <- CallerGone(r)
		_, _ = w.Write([]byte("ok"))
	}), nil)
	go func() { _ = srv.Serve(LimitListener(gl, 10, nil)) }()
	t.Cleanup(func() { _ = srv.Close() })

	const req = "POST /x HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"
	for _, tc := range []struct {
		name     string
		closeOut bool
	}{{"still waiting", false}, {"closed before the read", true}} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := net.Dial("tcp", gl.Addr().String())
			require.NoError(t, err)
			defer func() { _ = c.Close() }()
			_, err = c.Write([]byte(req))
			require.NoError(t, err)
			if tc.closeOut {
				require.NoError(t, c.(*net.TCPConn).CloseWrite())
				time.Sleep(10 * time.Millisecond) // the FIN crosses loopback before the accept
			}
			gl.gate <- struct{}{}
			require.Equal(t, tc.closeOut, <-gone)
			if !tc.closeOut {
				resp, err := http.ReadResponse(bufio.NewReader(c), nil)
				require.NoError(t, err)
				require.Equal(t, http.StatusOK, resp.StatusCode)
			}
		})
	}
}

// TestCallerGoneWithoutConn: a request that did not come through a server
// made by NewServer (no connection in its context) is never gone.
func TestCallerGoneWithoutConn(t *testing.T) {
	r, err := http.NewRequest(http.MethodPost, "/x", strings.NewReader("{}"))
	require.NoError(t, err)
	require.False(t, CallerGone(r))
}
