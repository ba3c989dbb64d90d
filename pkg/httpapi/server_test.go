package httpapi

import (
	"bufio"
	"errors"
	"io"
	"net"
	"net/http"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

func gaugeValue(t *testing.T, g prometheus.Gauge) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, g.Write(&m))
	return m.GetGauge().GetValue()
}

// serve starts a hardened server (sc) answering "ok" on loopback.
func serve(t *testing.T, sc ServerConfig) (string, *Metrics) {
	t.Helper()
	m := NewMetrics(prometheus.NewRegistry(), "floodgate_test_api")
	ln, err := sc.Listen("127.0.0.1:0", m)
	require.NoError(t, err)
	mux := http.NewServeMux()
	mux.HandleFunc("GET /ok", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, "ok") })
	srv := sc.NewServer(Middleware(Options{Metrics: m}, mux), nil)
	done := make(chan error, 1)
	go func() { done <- Serve(srv, ln) }()
	t.Cleanup(func() { _ = srv.Close(); require.NoError(t, <-done) })
	return ln.Addr().String(), m
}

// keepAlive opens a connection and makes one keep-alive request on it.
func keepAlive(addr string) (net.Conn, error) {
	c, err := net.Dial("tcp", addr)
	if err != nil {
		return nil, err
	}
	if _, err := io.WriteString(c, "GET /ok HTTP/1.1\r\nHost: test\r\n\r\n"); err != nil {
		c.Close()
		return nil, err
	}
	res, err := http.ReadResponse(bufio.NewReader(c), nil)
	if err != nil {
		c.Close()
		return nil, err
	}
	_, _ = io.Copy(io.Discard, res.Body)
	res.Body.Close()
	if res.StatusCode != http.StatusOK {
		c.Close()
		return nil, errors.New(res.Status)
	}
	return c, nil
}

// keepAlives opens n keep-alive connections to addr, closed when t ends.
func keepAlives(t *testing.T, addr string, n int) []net.Conn {
	t.Helper()
	conns := make([]net.Conn, 0, n)
	t.Cleanup(func() {
		for _, c := range conns {
			c.Close()
		}
	})
	for range n {
		c, err := keepAlive(addr)
		require.NoError(t, err)
		conns = append(conns, c)
	}
	return conns
}

// 2,000 keep-alive connections left idle are closed by the server once the
// idle timeout passes (issue 22 S6: they were held forever).
func TestIdleConnectionsAreClosed(t *testing.T) {
	if testing.Short() {
		t.Skip("opens 2,000 loopback connections")
	}
	const n = 2000
	sc := DefaultServerConfig()
	sc.IdleTimeout = time.Second
	sc.MaxConns = n + 100
	addr, m := serve(t, sc)

	conns := keepAlives(t, addr, n)
	opened := time.Now()
	require.Equal(t, float64(n), gaugeValue(t, m.conns))

	var wg sync.WaitGroup
	closedAfter := make([]time.Duration, n)
	for i, c := range conns {
		wg.Go(func() {
			defer c.Close()
			_ = c.SetReadDeadline(time.Now().Add(20 * time.Second))
			_, err := c.Read(make([]byte, 1))
			if errors.Is(err, io.EOF) {
				closedAfter[i] = time.Since(opened)
			} else {
				closedAfter[i] = -1 // still open at our own deadline, or another error
			}
		})
	}
	wg.Wait()
	for i, d := range closedAfter {
		require.Greater(t, d, time.Duration(0), "connection %d was not closed by the server", i)
		require.Less(t, d, 15*time.Second, "connection %d", i)
	}
	require.Eventually(t, func() bool { return gaugeValue(t, m.conns) == 0 }, 5*time.Second, 10*time.Millisecond)
}

// The connection limit holds: with MaxConns open, the next connection is not
// served until one of them closes.
func TestConnectionLimitHolds(t *testing.T) {
	const limit = 50
	sc := DefaultServerConfig()
	sc.MaxConns = limit
	addr, m := serve(t, sc)

	conns := keepAlives(t, addr, limit)
	require.Equal(t, float64(limit), gaugeValue(t, m.conns))

	extra := make(chan error, 1)
	go func() {
		c, err := keepAlive(addr)
		if err == nil {
			c.Close()
		}
		extra <- err
	}()
	select {
	case err := <-extra:
		t.Fatalf("connection %d was served while %d were open (err %v)", limit+1, limit, err)
	case <-time.After(500 * time.Millisecond):
	}
	require.Equal(t, float64(limit), gaugeValue(t, m.conns))
	conns[0].Close()
	stacktest.Returned(t, extra, 5*time.Second, "the waiting connection is served once a slot freed")
}

func TestServerConfigFromEnv(t *testing.T) {
	vars := map[string]string{"FLOODGATE_HTTP_IDLE_TIMEOUT": "30s", "FLOODGATE_HTTP_MAX_CONNS": "10"}
	e := config.NewEnv(func(k string) string { return vars[k] })
	sc := ServerConfigFromEnv(e, DefaultServerConfig())
	require.NoError(t, e.Err())
	require.NoError(t, sc.Validate())
	require.Equal(t, 30*time.Second, sc.IdleTimeout)
	require.Equal(t, 10, sc.MaxConns)
	require.Equal(t, 5*time.Second, sc.ReadHeaderTimeout)

	require.Equal(t, 0, sc.Backlog, "unset: the system's backlog")

	vars = map[string]string{"FLOODGATE_HTTP_BACKLOG": "70000"}
	e = config.NewEnv(func(k string) string { return vars[k] })
	require.ErrorContains(t, ServerConfigFromEnv(e, DefaultServerConfig()).Validate(), "FLOODGATE_HTTP_BACKLOG")

	vars = map[string]string{"FLOODGATE_HTTP_MAX_CONNS": "0", "FLOODGATE_HTTP_WRITE_TIMEOUT": "forever"}
	e = config.NewEnv(func(k string) string { return vars[k] })
	sc = ServerConfigFromEnv(e, DefaultServerConfig())
	require.ErrorContains(t, e.Err(), "FLOODGATE_HTTP_WRITE_TIMEOUT")
	require.ErrorContains(t, sc.Validate(), "FLOODGATE_HTTP_MAX_CONNS")

	require.Nil(t, ServerConfigFromEnv(config.NewEnv(func(string) string { return "" }), DefaultServerConfig()).TLS, "plaintext unless set")
	vars = map[string]string{"FLOODGATE_HTTP_TLS_CERT_FILE": "/etc/tls/tls.crt"}
	e = config.NewEnv(func(k string) string { return vars[k] })
	ServerConfigFromEnv(e, DefaultServerConfig())
	require.ErrorContains(t, e.Err(), "FLOODGATE_HTTP_TLS_KEY_FILE", "a certificate without its key")
}

// TestListenBacklog: with FLOODGATE_HTTP_BACKLOG set, the kernel completes
// that many connections the server has not accepted, or one more;
// the next one's SYN is dropped and its dial times out. With the system's
// backlog (net.core.somaxconn, in the thousands) all of them complete. The
// dials are made one after another: dials racing each other can each be
// answered SYN-ACK before the queue fills (the kernel then drops their
// last ACK, and the client counts itself connected).
func TestListenBacklog(t *testing.T) {
	const backlog, dials = 4, 12
	connected := func(sc ServerConfig) int {
		t.Helper()
		ln, err := sc.Listen("127.0.0.1:0", nil) // never accepted
		require.NoError(t, err)
		defer ln.Close()
		n := 0
		for range dials {
			// A dropped SYN is sent again after 1 s: 500 ms is ample for a
			// handshake on loopback, even on a loaded machine, and short of
			// a retransmit.
			c, err := net.DialTimeout("tcp", ln.Addr().String(), 500*time.Millisecond)
			if err != nil {
				continue
			}
			defer c.Close()
			n++
		}
		return n
	}
	sc := DefaultServerConfig()
	require.Equal(t, dials, connected(sc), "the system's backlog holds every dial")
	sc.Backlog = backlog
	n := connected(sc)
	require.True(t, n == backlog || n == backlog+1, "a backlog of %d completes %d connections, want %d or one more (Linux holds one more than the bound)", backlog, n, backlog)

	require.ErrorContains(t, SetBacklog(nil, 1), "not a TCP listener")
}
