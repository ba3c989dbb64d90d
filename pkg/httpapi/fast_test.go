package httpapi

import (
	"bufio"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// serveFast serves routes natively and h through the adaptor, with c's
// limits, until the test ends; it returns the address.
func serveFast(t *testing.T, c ServerConfig, routes []FastRoute, h http.Handler, o Options) string {
	t.Helper()
	ln, err := c.Listen("127.0.0.1:0", nil)
	require.NoError(t, err)
	srv := c.NewFastServer(routes, Middleware(o, h), o, nil)
	done := make(chan error, 1)
	go func() { done <- ServeFast(srv, ln) }()
	t.Cleanup(func() {
		require.NoError(t, srv.Shutdown())
		require.NoError(t, <-done)
	})
	return ln.Addr().String()
}

// TestFastServerKeepsTheContract: a native route and the handler behind the
// adaptor answer with the same correlation id rules and problems as
// net/http would; fasthttp's own refusals (a header or body over its bound,
// a handler's panic) are problems too.
func TestFastServerKeepsTheContract(t *testing.T) {
	c := DefaultServerConfig()
	c.MaxHeaderBytes = 4 << 10
	mux := NewMux()
	mux.HandleFunc("GET /other", func(w http.ResponseWriter, r *http.Request) { _, _ = io.WriteString(w, RequestID(r.Context())) })
	mux.HandleFunc("POST /fast", func(w http.ResponseWriter, r *http.Request) { t.Error("the native route is not the mux's") })
	routes := []FastRoute{
		{Method: http.MethodPost, Path: "/fast", Handler: func(ctx *fasthttp.RequestCtx, id string) {
			ctx.SetContentType("text/plain")
			ctx.SetBodyString(id + " " + string(ctx.PostBody()))
		}},
		{Method: http.MethodPost, Path: "/panic", Handler: func(*fasthttp.RequestCtx, string) { panic("boom") }},
	}
	addr := serveFast(t, c, routes, mux, Options{MaxBody: 64})
	base := "http://" + addr

	post := func(path, id, body string) *http.Response {
		req, err := http.NewRequest(http.MethodPost, base+path, strings.NewReader(body))
		require.NoError(t, err)
		if id != "" {
			req.Header.Set(HeaderRequestID, id)
		}
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		t.Cleanup(func() { resp.Body.Close() })
		return resp
	}

	t.Run("native route, caller's id", func(t *testing.T) {
		resp := post("/fast?q=1", "abc-1", "hi")
		require.Equal(t, http.StatusOK, resp.StatusCode)
		require.Equal(t, "abc-1", resp.Header.Get(HeaderRequestID))
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, "abc-1 hi", string(b))
		require.Empty(t, resp.Header.Get("Server"), "no server banner")
	})
	t.Run("native route, minted id", func(t *testing.T) {
		resp := post("/fast", "not valid!", "")
		id := resp.Header.Get(HeaderRequestID)
		require.Len(t, id, IDLen)
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, id+" ", string(b))
	})
	t.Run("other routes are the handler's", func(t *testing.T) {
		resp, err := http.Get(base + "/other")
		require.NoError(t, err)
		defer resp.Body.Close()
		b, _ := io.ReadAll(resp.Body)
		require.Equal(t, resp.Header.Get(HeaderRequestID), string(b))
	})
	t.Run("404 and 405 are problems", func(t *testing.T) {
		resp := post("/nowhere", "nf-1", "")
		require.Equal(t, http.StatusNotFound, resp.StatusCode)
		p := decodeProblemBody(t, resp)
		require.Equal(t, ProblemNotFound, p.Type)
		require.Equal(t, "nf-1", p.CorrelationID)
		resp = post("/other", "", "")
		require.Equal(t, http.StatusMethodNotAllowed, resp.StatusCode)
		require.Equal(t, ProblemMethodNotAllowed, decodeProblemBody(t, resp).Type)
	})
	t.Run("panic is a 500 problem", func(t *testing.T) {
		resp := post("/panic", "p-1", "")
		require.Equal(t, http.StatusInternalServerError, resp.StatusCode)
		require.Equal(t, "p-1", resp.Header.Get(HeaderRequestID))
		p := decodeProblemBody(t, resp)
		require.Equal(t, ProblemInternal, p.Type)
		require.Equal(t, "p-1", p.CorrelationID)
	})
	t.Run("body over the bound is a 413 problem", func(t *testing.T) {
		resp := post("/fast", "big-1", strings.Repeat("x", 65))
		require.Equal(t, http.StatusRequestEntityTooLarge, resp.StatusCode)
		require.Equal(t, "big-1", resp.Header.Get(HeaderRequestID))
		p := decodeProblemBody(t, resp)
		require.Equal(t, ProblemTooLarge, p.Type)
		require.Equal(t, "big-1", p.CorrelationID, "a refusal before routing keeps the caller's correlation id")
	})
	t.Run("header over the bound is a 431 problem", func(t *testing.T) {
		req, err := http.NewRequest(http.MethodPost, base+"/fast", nil)
		require.NoError(t, err)
		req.Header.Set("X-Big", strings.Repeat("y", 5<<10))
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusRequestHeaderFieldsTooLarge, resp.StatusCode)
		p := decodeProblemBody(t, resp)
		require.Equal(t, ProblemInvalidRequest, p.Type)
		require.True(t, ValidRequestID(p.CorrelationID), "a minted correlation id: %q", p.CorrelationID)
		require.Equal(t, p.CorrelationID, resp.Header.Get(HeaderRequestID))
	})
}

// TestFastServerBoundsSlowHeaders: a client that sends its request line and
// headers slower than ReadHeaderTimeout is cut off, as net/http does.
func TestFastServerBoundsSlowHeaders(t *testing.T) {
	c := DefaultServerConfig()
	c.ReadHeaderTimeout, c.ReadTimeout = 200*time.Millisecond, time.Second
	addr := serveFast(t, c, nil, NewMux(), Options{})
	conn, err := net.Dial("tcp", addr)
	require.NoError(t, err)
	defer conn.Close()
	_, err = io.WriteString(conn, "GET /healthz HTTP/1.1\r\nHost: x\r\n") // and never the blank line
	require.NoError(t, err)
	start := time.Now()
	require.NoError(t, conn.SetReadDeadline(time.Now().Add(5*time.Second)))
	resp, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err == nil { // an answer (408) before the close is fine; a served request is not
		resp.Body.Close()
		require.Equal(t, http.StatusRequestTimeout, resp.StatusCode)
	}
	require.Less(t, time.Since(start), 2*time.Second, "cut off after ReadHeaderTimeout")
}
