package server

import (
	"net"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

// transports are the servers the check API's HTTP contract is tested on.
var transports = []string{httpapi.TransportNetHTTP, httpapi.TransportFastHTTP}

// forTransports runs f once per transport, as a subtest named after it.
func forTransports(t *testing.T, f func(t *testing.T, tr string)) {
	for _, tr := range transports {
		t.Run(tr, func(t *testing.T) { f(t, tr) })
	}
}

// testServer is a check API served for a test.
type testServer struct{ URL string }

// serveOn serves s's check API on tr until the test ends and returns its
// base URL: on net/http as s.Handler() alone (as the tests always served
// it), on fasthttp as the service does (FastRoutes natively, the rest
// through httpapi.Middleware and s.Handler()).
func serveOn(t *testing.T, s *Server, tr string) string {
	t.Helper()
	if tr == httpapi.TransportNetHTTP {
		srv := httptest.NewServer(s.Handler())
		t.Cleanup(srv.Close)
		return srv.URL
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	o := httpapi.Options{MaxBody: 1 << 20}
	fs := httpapi.DefaultServerConfig().NewFastServer(s.FastRoutes(), httpapi.Middleware(o, s.Handler()), o, nil)
	done := make(chan error, 1)
	go func() { done <- httpapi.ServeFast(fs, ln) }()
	t.Cleanup(func() {
		require.NoError(t, fs.Shutdown())
		require.NoError(t, <-done)
	})
	return "http://" + ln.Addr().String()
}
