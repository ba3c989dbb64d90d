package remote

import (
	"context"
	"errors"
	"net"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

var errDown = errors.New("svc unavailable")

// TestDo: a refusal is an *Error naming the service (ETag kept), a 5xx is
// that and unavailable, a transport failure is unavailable, and the
// correlation id the caller gives goes along.
func TestDo(t *testing.T) {
	t.Parallel()
	var gotID string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		gotID = r.Header.Get(httpapi.HeaderRequestID)
		switch r.URL.Path {
		case "/ok":
			w.Header().Set("ETag", `"7"`)
			_, _ = w.Write([]byte(`{"v":1}`))
		case "/stale":
			w.Header().Set("ETag", `"8"`)
			httpapi.WriteProblem(w, r, httpapi.Problem{Type: httpapi.ProblemConflict, Status: http.StatusPreconditionFailed, Detail: "changed"})
		default:
			httpapi.WriteProblem(w, r, httpapi.Problem{Type: httpapi.ProblemUnavailable, Status: http.StatusServiceUnavailable, Detail: "busy"})
		}
	}))
	t.Cleanup(srv.Close)
	c, err := New(httpapi.ClientConfig{Name: "svc", BaseURL: srv.URL}, errDown)
	require.NoError(t, err)
	ctx := context.Background()

	var out struct{ V int }
	h, err := c.Do(ctx, "corr-1", httpapi.Call{Method: http.MethodGet, Path: "/ok", Out: &out})
	require.NoError(t, err)
	require.Equal(t, 1, out.V)
	require.Equal(t, `"7"`, h.Get("ETag"))
	require.Equal(t, "corr-1", gotID, "the caller's correlation id")

	for _, tc := range []struct {
		path        string
		status      int
		unavailable bool
		etag        string
	}{
		{"/stale", http.StatusPreconditionFailed, false, `"8"`},
		{"/busy", http.StatusServiceUnavailable, true, ""},
	} {
		_, err := c.Do(ctx, "", httpapi.Call{Method: http.MethodPut, Path: tc.path, Body: map[string]int{"a": 1}})
		var re *Error
		require.ErrorAs(t, err, &re, tc.path)
		require.Equal(t, "svc", re.Service)
		require.Equal(t, tc.status, re.Status)
		require.Equal(t, tc.etag, re.ETag)
		require.Equal(t, tc.unavailable, errors.Is(err, errDown), tc.path)
	}

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	dead := "http://" + ln.Addr().String()
	require.NoError(t, ln.Close())
	d, err := New(httpapi.ClientConfig{Name: "svc", BaseURL: dead}, errDown)
	require.NoError(t, err)
	_, err = d.Do(ctx, "", httpapi.Call{Method: http.MethodGet, Path: "/ok"})
	require.ErrorIs(t, err, errDown)
	var re *Error
	require.False(t, errors.As(err, &re), "no answer is no refusal")

	_, err = New(httpapi.ClientConfig{Name: "svc", BaseURL: "ftp://x"}, errDown)
	require.Error(t, err)
}
