package httpapi

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"
	"github.com/valyala/fasthttp/fasthttpadaptor"
)

// Transports an API can be served on (ServerConfig.NewFastServer).
const (
	TransportNetHTTP  = "nethttp"
	TransportFastHTTP = "fasthttp"
)

// FastHandler serves one request of a FastRoute on fasthttp. id is the
// request's correlation id (the caller's X-Request-Id when well formed,
// else minted), already echoed on the answer as Middleware does. It owns
// ctx only until it returns (fasthttp reuses it).
type FastHandler func(ctx *fasthttp.RequestCtx, id string)

// FastRoute is an endpoint a fasthttp server answers natively: the hot
// paths, whose per-request cost net/http's machinery would dominate. It
// must answer exactly as the net/http handler of the same route does.
type FastRoute struct {
	Method  string // "POST"
	Path    string // "/v1/check": matched against the request's raw path, exactly
	Handler FastHandler
}

// Pattern is the route's http.ServeMux pattern, its metrics label.
func (r FastRoute) Pattern() string { return r.Method + " " + r.Path }

// NewFastServer returns a fasthttp server with c's limits, the
// alternative to NewServer for an API whose hot paths are FastRoutes. A
// request for a route's method and exact raw path (query aside) is served
// natively, with what Middleware does for every request (the correlation
// id, the body bound, panic recovery, metrics and the access log per o);
// every other request is served by h — the API as NewServer would serve
// it, Middleware included — through fasthttpadaptor, so 404s, 405s,
// health, OpenAPI and every problem keep one definition. With tracing on,
// give no routes: h then carries every request, spans included.
//
// c's limits as fasthttp has them: MaxHeaderBytes is the per-connection
// read buffer (a longer header is a 431 problem); ReadHeaderTimeout bounds
// the request line and headers from their first byte and ReadTimeout the
// body from the end of the headers; WriteTimeout bounds writing the
// answer; IdleTimeout a keep-alive wait; o.MaxBody the body (over it: a
// 413 problem, the body not read). MaxConns is the listener's
// (ServerConfig.Listen), as for net/http. An idle keep-alive connection
// holds no buffers (fasthttp's ReduceMemoryUsage): 5.6 KiB each, against
// 29 KiB with its 16 KiB read buffer kept and 19 KiB on net/http (5,000
// idle connections, 2026-11-29); its CPU cost per check was within the
// pinned peerbench's noise (docs/benchmarks.md).
func (c ServerConfig) NewFastServer(routes []FastRoute, h http.Handler, o Options, log *slog.Logger) *fasthttp.Server {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	maxBody := o.MaxBody
	switch {
	case maxBody == 0:
		maxBody = DefaultMaxBody
	case maxBody < 0:
		maxBody = 1 << 30 // fasthttp always bounds bodies: "no cap" is a large one
	}
	f := &fastServer{routes: routes, fallback: fasthttpadaptor.NewFastHTTPHandler(h), o: o}
	for i := range routes {
		f.patterns = append(f.patterns, routes[i].Pattern())
	}
	readTimeout := c.ReadTimeout
	s := &fasthttp.Server{
		Handler:      f.serve,
		ErrorHandler: fastError,
		HeaderReceived: func(*fasthttp.RequestHeader) fasthttp.RequestConfig {
			return fasthttp.RequestConfig{ReadTimeout: readTimeout}
		},
		Concurrency:                  c.MaxConns,
		ReadBufferSize:               c.MaxHeaderBytes,
		ReadTimeout:                  c.ReadHeaderTimeout,
		WriteTimeout:                 c.WriteTimeout,
		IdleTimeout:                  c.IdleTimeout,
		MaxRequestBodySize:           int(maxBody),
		NoDefaultServerHeader:        true,
		NoDefaultContentType:         true,
		DisablePreParseMultipartForm: true,
		CloseOnShutdown:              true,
		ReduceMemoryUsage:            true,
	}
	// fasthttp logs a connection's errors: malformed requests and bodies
	// over the bound among them, which the client caused and was answered
	// (as problems). At debug, so that no client can flood the log.
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	s.Logger = slog.NewLogLogger(log.Handler(), slog.LevelDebug)
	return s
}

type fastServer struct {
	routes   []FastRoute
	patterns []string // routes[i].Pattern()
	fallback fasthttp.RequestHandler
	o        Options
}

// serve dispatches one request: a route's natively, any other through h.
func (f *fastServer) serve(ctx *fasthttp.RequestCtx) {
	uri := ctx.Request.Header.RequestURI()
	if i := bytes.IndexByte(uri, '?'); i >= 0 {
		uri = uri[:i]
	}
	method := ctx.Request.Header.Method()
	for i := range f.routes {
		if rt := &f.routes[i]; string(uri) == rt.Path && string(method) == rt.Method {
			f.serveRoute(ctx, rt.Handler, f.patterns[i])
			return
		}
	}
	f.fallback(ctx)
}

// serveRoute is Middleware for a native route.
func (f *fastServer) serveRoute(ctx *fasthttp.RequestCtx, h FastHandler, pattern string) {
	var start time.Time
	if f.o.Metrics != nil || f.o.AccessLog {
		start = time.Now()
	}
	id := fastRequestID(ctx)
	defer func() {
		if p := recover(); p != nil {
			f.o.Log.Error("handler panic", "method", string(ctx.Method()), "path", string(ctx.Path()), "panic", fmt.Sprint(p), LogKey, id)
			ctx.Response.Reset()
			ctx.Response.Header.Set(HeaderRequestID, id)
			WriteFastProblem(ctx, internalProblem(id))
		}
		if f.o.Metrics == nil && !f.o.AccessLog {
			return
		}
		code, elapsed := ctx.Response.StatusCode(), time.Since(start)
		f.o.observe(pattern, code, elapsed)
		if f.o.AccessLog {
			f.o.logRequest(context.Background(), string(ctx.Method()), string(ctx.Path()), pattern, ctx.RemoteAddr().String(),
				code, int64(len(ctx.Response.Body())), elapsed, slog.String(LogKey, id))
		}
	}()
	h(ctx, id)
}

// fastRequestID is the request's correlation id — the caller's
// X-Request-Id when well formed, else minted — echoed on the answer.
func fastRequestID(ctx *fasthttp.RequestCtx) string {
	id := string(ctx.Request.Header.Peek(HeaderRequestID))
	if !ValidRequestID(id) {
		id = NewRequestID()
	}
	ctx.Response.Header.Set(HeaderRequestID, id)
	return id
}

// fastError answers a request fasthttp could not read as a problem, as
// every refusal is: a header over the read buffer 431, a body over the
// limit 413, a timeout 408, anything else 400 — with a correlation id, the
// caller's when its header was read and well formed.
func fastError(ctx *fasthttp.RequestCtx, err error) {
	id := fastRequestID(ctx)
	p := Problem{Type: ProblemInvalidRequest, Status: http.StatusBadRequest, Detail: "malformed request", CorrelationID: id}
	var small *fasthttp.ErrSmallBuffer
	var netErr net.Error
	switch {
	case errors.As(err, &small):
		p.Status, p.Detail = http.StatusRequestHeaderFieldsTooLarge, "request header too large"
	case errors.Is(err, fasthttp.ErrBodyTooLarge):
		p.Type, p.Status, p.Detail = ProblemTooLarge, http.StatusRequestEntityTooLarge, "body over the limit"
	case errors.As(err, &netErr) && netErr.Timeout():
		p.Status, p.Detail = http.StatusRequestTimeout, "request not read in time"
	}
	ctx.SetConnectionClose()
	WriteFastProblem(ctx, p)
}

// WriteFastProblem answers ctx with p as application/problem+json, as
// WriteProblem does on net/http.
func WriteFastProblem(ctx *fasthttp.RequestCtx, p Problem) {
	status, body := problemBody(p)
	ctx.Response.Header.Set("Content-Type", ContentTypeProblem)
	ctx.Response.Header.Set("Cache-Control", "no-store")
	ctx.SetStatusCode(status)
	ctx.SetBody(body)
}

// ServeFast runs srv on ln until it is shut down. Its connections
// (fastConn) read a request in one system call where fasthttp would make
// two, and put a deadline on the socket only when a read or write waits.
func ServeFast(srv *fasthttp.Server, ln net.Listener) error {
	return srv.Serve(fastListener{ln})
}

// ShutdownFast stops srv accepting and waits for in-flight requests until
// ctx ends, then closes what is left.
func ShutdownFast(ctx context.Context, srv *fasthttp.Server) error {
	return srv.ShutdownWithContext(ctx)
}

// CallerGoneConn is CallerGone for a connection a server hands its
// handlers (fasthttp's RequestCtx.Conn).
func CallerGoneConn(c net.Conn) bool { return connGone(c) }
