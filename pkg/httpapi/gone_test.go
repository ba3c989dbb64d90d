package httpapi

import (
	"bufio"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi/httpapitest"
)

// TestCallerGone: a caller that sent its request and then closed its side
// before the server read it is gone; one that still waits is not.
func TestCallerGone(t *testing.T) {
	gl := httpapitest.NewGatedListener(t)
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
			c := gl.Send(t, req, tc.closeOut)
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
