package app

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestSecurityConnectionsAreBoundedS6 replays finding S6 of issue 22: idle
// keep-alive connections were held forever and nothing bounded how many a
// client could open. Now idle connections are closed after the idle timeout
// and at most FLOODGATE_LIMITER_MAX_CONNS are served at once.
func TestSecurityConnectionsAreBoundedS6(t *testing.T) {
	redistest.Client(t)
	httpAddr := stacktest.FreeAddr(t)
	env := map[string]string{
		"FLOODGATE_LIMITER_ADDR": httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR": "off", "FLOODGATE_GATEWAY": "s6-test",
		"FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "2", "FLOODGATE_LIMITER_INFLUX_INTERVAL": "0",
		"FLOODGATE_LIMITER_IDLE_TIMEOUT": "300ms", "FLOODGATE_LIMITER_MAX_CONNS": "20", "FLOODGATE_JOURNAL_DIR": t.TempDir(),
	}
	startLimiter(t, env)
	stacktest.WaitOK(t, "http://"+httpAddr+"/healthz", 10*time.Second)

	// Idle keep-alive connections: each made one request, then went quiet.
	var idle []net.Conn
	for range 15 {
		c, err := net.Dial("tcp", httpAddr)
		require.NoError(t, err)
		_, err = io.WriteString(c, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
		require.NoError(t, err)
		resp, err := http.ReadResponse(bufio.NewReader(c), nil)
		require.NoError(t, err)
		resp.Body.Close()
		idle = append(idle, c)
	}
	time.Sleep(800 * time.Millisecond)
	for i, c := range idle {
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
		_, err := c.Read(make([]byte, 1))
		require.ErrorIs(t, err, io.EOF, "idle connection %d was closed by the server", i)
		c.Close()
	}

	// The connection limit: 20 held connections, the 21st waits.
	var held []net.Conn
	for range 20 {
		c, err := net.Dial("tcp", httpAddr)
		require.NoError(t, err)
		held = append(held, c)
	}
	time.Sleep(100 * time.Millisecond)
	extra, err := net.Dial("tcp", httpAddr)
	require.NoError(t, err)
	defer extra.Close()
	_, err = io.WriteString(extra, "GET /healthz HTTP/1.1\r\nHost: x\r\n\r\n")
	require.NoError(t, err)
	require.NoError(t, extra.SetReadDeadline(time.Now().Add(300*time.Millisecond)))
	_, err = extra.Read(make([]byte, 1))
	require.Error(t, err, "not served while 20 connections are held")
	for _, c := range held {
		c.Close()
	}
	require.NoError(t, extra.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(extra), nil)
	require.NoError(t, err, "served once a slot is free")
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)
}
