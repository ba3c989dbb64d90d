package httpapi

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// ServerConfig bounds what one client can hold of a server. Every service
// reads it from the same variables (ServerConfigFromEnv).
type ServerConfig struct {
	ReadHeaderTimeout time.Duration // FLOODGATE_HTTP_READ_HEADER_TIMEOUT: request line and headers
	ReadTimeout       time.Duration // FLOODGATE_HTTP_READ_TIMEOUT: the whole request, body included
	WriteTimeout      time.Duration // FLOODGATE_HTTP_WRITE_TIMEOUT: from the end of the headers to the end of the answer
	IdleTimeout       time.Duration // FLOODGATE_HTTP_IDLE_TIMEOUT: a keep-alive connection waiting for its next request
	MaxConns          int           // FLOODGATE_HTTP_MAX_CONNS: open connections per listener; more wait in the kernel's backlog
	MaxHeaderBytes    int           // FLOODGATE_HTTP_MAX_HEADER_BYTES
	// Backlog (FLOODGATE_HTTP_BACKLOG) bounds the connections the kernel
	// holds connected but not yet accepted; past it a new connection's
	// SYN is dropped, at no cost to the server, and its client retries or
	// gives up. 0: the system's bound (net.core.somaxconn, as Go's
	// net.Listen). A server past saturation accepts its backlog in order,
	// oldest first, so a long one is a queue of callers who have gone.
	Backlog int
	// TLS serves every listener over TLS (FLOODGATE_HTTP_TLS_CERT_FILE and
	// _KEY_FILE); nil: plaintext.
	TLS *config.ServerTLS
}

// HTTPTLSVars are the variables of the HTTP ports' TLS: a server
// certificate only — the probes and Prometheus that read these ports hold
// no client certificate; callers authenticate with their tokens.
var HTTPTLSVars = config.ServerTLSVars{Cert: "FLOODGATE_HTTP_TLS_CERT_FILE", Key: "FLOODGATE_HTTP_TLS_KEY_FILE"}

// DefaultServerConfig is what an unset variable means.
func DefaultServerConfig() ServerConfig {
	return ServerConfig{
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       30 * time.Second,
		WriteTimeout:      60 * time.Second,
		IdleTimeout:       90 * time.Second,
		MaxConns:          4096,
		MaxHeaderBytes:    64 << 10,
	}
}

// ServerConfigFromEnv reads FLOODGATE_HTTP_*, starting from def; malformed
// values are recorded on e.
func ServerConfigFromEnv(e *config.Env, def ServerConfig) ServerConfig {
	return ServerConfig{
		ReadHeaderTimeout: e.Duration("FLOODGATE_HTTP_READ_HEADER_TIMEOUT", def.ReadHeaderTimeout),
		ReadTimeout:       e.Duration("FLOODGATE_HTTP_READ_TIMEOUT", def.ReadTimeout),
		WriteTimeout:      e.Duration("FLOODGATE_HTTP_WRITE_TIMEOUT", def.WriteTimeout),
		IdleTimeout:       e.Duration("FLOODGATE_HTTP_IDLE_TIMEOUT", def.IdleTimeout),
		MaxConns:          e.Int("FLOODGATE_HTTP_MAX_CONNS", def.MaxConns),
		MaxHeaderBytes:    e.Int("FLOODGATE_HTTP_MAX_HEADER_BYTES", def.MaxHeaderBytes),
		Backlog:           e.Int("FLOODGATE_HTTP_BACKLOG", def.Backlog),
		TLS:               e.ServerTLS(HTTPTLSVars, "http/1.1"),
	}
}

// Validate checks ranges; errors name the variable.
func (c ServerConfig) Validate() error {
	var v config.Check
	v.Require(c.ReadHeaderTimeout > 0 && c.ReadHeaderTimeout <= time.Minute, "FLOODGATE_HTTP_READ_HEADER_TIMEOUT", "%s: want (0, 1m]", c.ReadHeaderTimeout)
	v.Require(c.ReadTimeout >= c.ReadHeaderTimeout && c.ReadTimeout <= time.Hour, "FLOODGATE_HTTP_READ_TIMEOUT", "%s: want FLOODGATE_HTTP_READ_HEADER_TIMEOUT (%s) to 1h", c.ReadTimeout, c.ReadHeaderTimeout)
	v.Require(c.WriteTimeout > 0 && c.WriteTimeout <= time.Hour, "FLOODGATE_HTTP_WRITE_TIMEOUT", "%s: want (0, 1h]", c.WriteTimeout)
	v.Require(c.IdleTimeout > 0 && c.IdleTimeout <= time.Hour, "FLOODGATE_HTTP_IDLE_TIMEOUT", "%s: want (0, 1h]", c.IdleTimeout)
	v.Require(c.MaxConns >= 1 && c.MaxConns <= 1_000_000, "FLOODGATE_HTTP_MAX_CONNS", "%d: want 1..1000000", c.MaxConns)
	v.Require(c.MaxHeaderBytes >= 4<<10 && c.MaxHeaderBytes <= 1<<20, "FLOODGATE_HTTP_MAX_HEADER_BYTES", "%d: want 4096..1048576", c.MaxHeaderBytes)
	v.Require(c.Backlog >= 0 && c.Backlog <= 65535, "FLOODGATE_HTTP_BACKLOG", "%d: want 0 (the system's) or 1..65535", c.Backlog)
	return v.Err()
}

// NewServer returns an http.Server with c's timeouts serving h.
func (c ServerConfig) NewServer(h http.Handler, log *slog.Logger) *http.Server {
	s := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: c.ReadHeaderTimeout,
		ReadTimeout:       c.ReadTimeout,
		WriteTimeout:      c.WriteTimeout,
		IdleTimeout:       c.IdleTimeout,
		MaxHeaderBytes:    c.MaxHeaderBytes,
		ConnContext:       ConnContext,
	}
	if log != nil {
		s.ErrorLog = slog.NewLogLogger(log.Handler(), slog.LevelWarn)
	}
	return s
}

// Listen opens addr with c's backlog, connection limit and TLS.
func (c ServerConfig) Listen(addr string, m *Metrics) (net.Listener, error) {
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("listen %s: %w", addr, err)
	}
	if c.Backlog > 0 {
		if err := SetBacklog(ln, c.Backlog); err != nil {
			_ = ln.Close()
			return nil, fmt.Errorf("listen %s: FLOODGATE_HTTP_BACKLOG %d: %w", addr, c.Backlog, err)
		}
	}
	ln = LimitListener(ln, c.MaxConns, m)
	if c.TLS != nil {
		ln = c.TLS.Listener(ln) // the servers bound each handshake with their read deadline
	}
	return ln, nil
}

// SetBacklog sets a listening TCP socket's backlog to n: listen(2) again
// on the open socket, which Linux allows and which changes only the bound.
func SetBacklog(ln net.Listener, n int) error {
	tl, ok := ln.(*net.TCPListener)
	if !ok {
		return fmt.Errorf("not a TCP listener (%T)", ln)
	}
	rc, err := tl.SyscallConn()
	if err != nil {
		return err
	}
	var lerr error
	if err := rc.Control(func(fd uintptr) { lerr = syscall.Listen(int(fd), n) }); err != nil {
		return err
	}
	return lerr
}

// LimitListener accepts at most n connections at once: Accept waits while n
// are open, so further clients queue in the kernel's backlog instead of each
// costing a goroutine and buffers. m (optional) counts open connections.
func LimitListener(ln net.Listener, n int, m *Metrics) net.Listener {
	return &limitListener{Listener: ln, sem: make(chan struct{}, n), done: make(chan struct{}), m: m}
}

type limitListener struct {
	net.Listener
	sem       chan struct{}
	done      chan struct{}
	closeOnce sync.Once
	m         *Metrics
}

func (l *limitListener) Accept() (net.Conn, error) {
	select {
	case l.sem <- struct{}{}:
	case <-l.done:
		return nil, net.ErrClosed
	}
	c, err := l.Listener.Accept()
	if err != nil {
		<-l.sem
		return nil, err
	}
	if l.m != nil {
		l.m.conns.Inc()
	}
	return &limitConn{Conn: c, l: l}, nil
}

func (l *limitListener) Close() error {
	err := l.Listener.Close()
	l.closeOnce.Do(func() { close(l.done) })
	return err
}

type limitConn struct {
	net.Conn
	l    *limitListener
	once sync.Once
}

// Unwrap is the accepted connection (CallerGone reads its socket).
func (c *limitConn) Unwrap() net.Conn { return c.Conn }

func (c *limitConn) Close() error {
	err := c.Conn.Close()
	c.once.Do(func() {
		<-c.l.sem
		if c.l.m != nil {
			c.l.m.conns.Dec()
		}
	})
	return err
}

// Metrics are one API's request metrics, registered under a name prefix
// such as floodgate_adjuster_admin: <prefix>_requests_total{route,code},
// <prefix>_request_duration_seconds{route} and <prefix>_connections.
type Metrics struct {
	requests *prometheus.CounterVec
	duration *prometheus.HistogramVec
	conns    prometheus.Gauge
}

// NewMetrics registers the metrics on reg (nil: not registered).
func NewMetrics(reg prometheus.Registerer, prefix string) *Metrics {
	f := promauto.With(reg)
	return &Metrics{
		requests: f.NewCounterVec(prometheus.CounterOpts{Name: prefix + "_requests_total",
			Help: "HTTP requests by route (the matched pattern) and status code."}, []string{"route", "code"}),
		duration: f.NewHistogramVec(prometheus.HistogramOpts{Name: prefix + "_request_duration_seconds",
			Help: "HTTP request duration by route.", Buckets: []float64{.001, .005, .01, .05, .1, .5, 1, 5, 30}}, []string{"route"}),
		conns: f.NewGauge(prometheus.GaugeOpts{Name: prefix + "_connections",
			Help: "Open HTTP connections (bounded by FLOODGATE_HTTP_MAX_CONNS)."}),
	}
}

// NewConnMetrics registers only the open-connections gauge <prefix>_connections
// (help says what bounds it), for a listener whose requests are counted
// elsewhere or not at all (LimitListener); not for Middleware.
func NewConnMetrics(reg prometheus.Registerer, prefix, help string) *Metrics {
	return &Metrics{conns: promauto.With(reg).NewGauge(prometheus.GaugeOpts{Name: prefix + "_connections", Help: help})}
}

// Options configure Middleware.
type Options struct {
	Log     *slog.Logger
	Metrics *Metrics // nil: none
	// AccessLog logs one line per request (info; 5xx at warn). Off for hot
	// paths such as the limiter's checks.
	AccessLog bool
	// MaxBody caps request bodies (0: DefaultMaxBody; negative: no cap).
	MaxBody int64
}

// Middleware is the outer layer of every API: the correlation id (read or
// minted, echoed, in the context and the logs), the body limit, the access
// log and the request metrics, with the route label taken from the
// ServeMux pattern that matched.
func Middleware(o Options, next http.Handler) http.Handler {
	if o.Log == nil {
		o.Log = slog.New(slog.DiscardHandler)
	}
	maxBody := o.MaxBody
	if maxBody == 0 {
		maxBody = DefaultMaxBody
	}
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		start := time.Now()
		id, minted := requestIDFrom(r)
		w.Header()[HeaderRequestID] = []string{id}
		if minted {
			r.Header.Set(HeaderRequestID, id) // handlers that read the header see the same id
		}
		info := &requestInfo{id: id}
		r = r.WithContext(context.WithValue(r.Context(), requestIDKey{}, info))
		if maxBody > 0 && r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, maxBody)
		}
		sw := &statusWriter{ResponseWriter: w}
		defer func() {
			if p := recover(); p != nil {
				if err, ok := p.(error); ok && errors.Is(err, http.ErrAbortHandler) {
					panic(p)
				}
				o.Log.ErrorContext(r.Context(), "handler panic", "method", r.Method, "path", r.URL.Path, "panic", fmt.Sprint(p))
				if !sw.wrote {
					WriteProblem(sw, r, internalProblem(id))
				}
			}
			route := r.Pattern
			if route == "" {
				route = "unmatched"
			}
			code := sw.code
			if code == 0 {
				code = http.StatusOK
			}
			elapsed := time.Since(start)
			o.observe(route, code, elapsed)
			if o.AccessLog {
				var who []slog.Attr
				if c := info.caller; c.Name != "" {
					who = []slog.Attr{slog.String("actor", c.Name), slog.String("role", c.Role)}
				}
				o.logRequest(r.Context(), r.Method, r.URL.Path, route, r.RemoteAddr, code, sw.bytes, elapsed, who...)
			}
		}()
		next.ServeHTTP(sw, r)
	})
}

// internalProblem answers a handler's panic: no detail but the id to quote.
func internalProblem(id string) Problem {
	return Problem{Type: ProblemInternal, Status: http.StatusInternalServerError,
		Detail: "internal error; quote request id " + id + " to an operator", CorrelationID: id}
}

// observe counts a request in o.Metrics, when set.
func (o Options) observe(route string, code int, elapsed time.Duration) {
	if o.Metrics != nil {
		o.Metrics.requests.WithLabelValues(route, strconv.Itoa(code)).Inc()
		o.Metrics.duration.WithLabelValues(route).Observe(elapsed.Seconds())
	}
}

// logRequest writes a request's access-log line (Options.AccessLog), at
// WARN for a 5xx; extra follows the common attributes.
func (o Options) logRequest(ctx context.Context, method, path, route, remote string, code int, bytes int64, elapsed time.Duration, extra ...slog.Attr) {
	level := slog.LevelInfo
	if code >= 500 {
		level = slog.LevelWarn
	}
	attrs := append([]slog.Attr{slog.String("method", method), slog.String("path", path), slog.String("route", route),
		slog.Int("status", code), slog.Int64("bytes", bytes), slog.Duration("duration", elapsed),
		slog.String("remote", remote)}, extra...)
	o.Log.LogAttrs(ctx, level, "http request", attrs...)
}

// statusWriter records the status and size of an answer. It unwraps for
// http.ResponseController (a handler may lift its write deadline).
type statusWriter struct {
	http.ResponseWriter
	code  int
	bytes int64
	wrote bool
}

func (w *statusWriter) WriteHeader(code int) {
	if !w.wrote {
		w.code, w.wrote = code, true
	}
	w.ResponseWriter.WriteHeader(code)
}

func (w *statusWriter) Write(b []byte) (int, error) {
	if !w.wrote {
		w.code, w.wrote = http.StatusOK, true
	}
	n, err := w.ResponseWriter.Write(b)
	w.bytes += int64(n)
	return n, err
}

func (w *statusWriter) Unwrap() http.ResponseWriter { return w.ResponseWriter }

// Flush passes through for streaming answers.
func (w *statusWriter) Flush() {
	if f, ok := w.ResponseWriter.(http.Flusher); ok {
		f.Flush()
	}
}

// Serve runs srv on ln until it is shut down; http.ErrServerClosed is not an error.
func Serve(srv *http.Server, ln net.Listener) error {
	if err := srv.Serve(ln); !errors.Is(err, http.ErrServerClosed) {
		return err
	}
	return nil
}

// Shutdown stops srv accepting and waits for in-flight requests until ctx
// ends, then closes what is left.
func Shutdown(ctx context.Context, srv *http.Server) error {
	err := srv.Shutdown(ctx)
	if err != nil {
		_ = srv.Close()
	}
	return err
}
