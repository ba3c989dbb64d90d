package service

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"go.opentelemetry.io/otel/attribute"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// ErrShutdownTimeout is returned (wrapped, naming them) when parts were still
// running at the shutdown deadline.
var ErrShutdownTimeout = errors.New("still running at the shutdown deadline")

// RunnerConfig is the runner's share of the environment.
type RunnerConfig struct {
	// ShutdownTimeout bounds the whole drain, from not ready to closed
	// (FLOODGATE_SHUTDOWN_TIMEOUT).
	ShutdownTimeout time.Duration
	// HTTP bounds every HTTP server the runner starts (FLOODGATE_HTTP_*).
	HTTP httpapi.ServerConfig
}

// RunnerConfigFromEnv reads and validates the runner's variables.
func RunnerConfigFromEnv(getenv config.Getenv, httpDefaults httpapi.ServerConfig) (RunnerConfig, error) {
	e := config.NewEnv(getenv)
	c := RunnerConfig{
		ShutdownTimeout: e.Duration("FLOODGATE_SHUTDOWN_TIMEOUT", 10*time.Second),
		HTTP:            httpapi.ServerConfigFromEnv(e, httpDefaults),
	}
	return config.Validated(c, e.Err())
}

// Validate checks ranges; errors name the variable.
func (c RunnerConfig) Validate() error {
	var v config.Check
	v.Require(c.ShutdownTimeout > 0 && c.ShutdownTimeout <= 10*time.Minute, "FLOODGATE_SHUTDOWN_TIMEOUT", "%s: want (0, 10m]", c.ShutdownTimeout)
	return errors.Join(v.Err(), c.HTTP.Validate())
}

type part struct {
	name  string
	run   func(ctx context.Context) error // returns when ctx is done (workers) or when stopped (listeners)
	stop  func(ctx context.Context) error // listeners: stop accepting, finish in-flight work until ctx ends
	stage stage
	done  chan struct{}
	err   error
}

type stage int

const (
	stageFront stage = iota // listeners and fetching workers: stopped first
	stageTail               // flushers, producers: stopped once the front has drained
)

// Runner runs one service's listeners and workers and stops them in order.
// Add parts before Run; Run once.
//
// Start: every part starts, then the service is ready (/readyz 200, the
// OnReady hooks get true). Stop (ctx done, or a part failed): not ready →
// listeners stop accepting and fetching workers' contexts end (each drains
// what it holds and commits before it returns) → wait for them → tail
// workers' contexts end (flush queued output) → wait → closers, last added
// first. One deadline, FLOODGATE_SHUTDOWN_TIMEOUT, covers the whole drain;
// a part still running then is reported by name in the returned error.
type Runner struct {
	env     Env
	cfg     RunnerConfig
	ready   atomic.Bool
	onReady []func(bool)
	parts   []*part
	closers []namedCloser
	health  *httpapi.Mux
	metrics map[string]*httpapi.Metrics
	started atomic.Bool
}

type namedCloser struct {
	name string
	fn   func() error
}

// NewRunner reads the runner's configuration from env.
func NewRunner(env Env, httpDefaults httpapi.ServerConfig) (*Runner, error) {
	cfg, err := RunnerConfigFromEnv(env.Getenv, httpDefaults)
	if err != nil {
		return nil, err
	}
	return NewRunnerWith(env, cfg), nil
}

// NewRunnerWith uses cfg as given (tests).
func NewRunnerWith(env Env, cfg RunnerConfig) *Runner {
	if env.Log == nil {
		env.Log = slog.New(slog.DiscardHandler)
	}
	if env.Registry == nil {
		env.Registry = prometheus.NewRegistry()
	}
	if cfg.HTTP.TLS != nil {
		cfg.HTTP.TLS.SetLogger(env.Log) // a renewal that fails to load is the service's log line
	}
	r := &Runner{env: env, cfg: cfg, health: httpapi.NewMux(), metrics: map[string]*httpapi.Metrics{}}
	r.health.HandleFunc("GET /healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	r.health.HandleFunc("GET /readyz", func(w http.ResponseWriter, _ *http.Request) {
		if !r.ready.Load() {
			http.Error(w, "not ready", http.StatusServiceUnavailable)
			return
		}
		_, _ = w.Write([]byte("ok\n"))
	})
	r.health.Handle("GET /metrics", promhttp.HandlerFor(env.Registry, promhttp.HandlerOpts{Registry: env.Registry}))
	return r
}

// Config is the runner's configuration.
func (r *Runner) Config() RunnerConfig { return r.cfg }

// Ready reports readiness: true from the end of start-up to the start of the drain.
func (r *Runner) Ready() bool { return r.ready.Load() }

// OnReady registers a hook told of every readiness change (gRPC health, a
// server's own /readyz).
func (r *Runner) OnReady(f func(ready bool)) { r.onReady = append(r.onReady, f) }

func (r *Runner) setReady(v bool) {
	r.ready.Store(v)
	for _, f := range r.onReady {
		f(v)
	}
}

// Health serves /healthz (live while the process runs), /readyz and
// /metrics; Handler mounts it on every API.
func (r *Runner) Health() http.Handler { return r.health }

// Handler mounts the health endpoints in front of api: /healthz, /readyz
// and /metrics are the runner's, every other path is api's.
func (r *Runner) Handler(api http.Handler) http.Handler {
	return r.Mount(API{Handler: api, Health: true})
}

// Mount is what Serve serves for api, before httpapi.Middleware: the
// health endpoints when api.Health, the OpenAPI document at
// httpapi.OpenAPIPath when api.OpenAPI is set, every other path api's.
// Its Routes list every pattern served (the OpenAPI drift tests compare
// them with the document).
func (r *Runner) Mount(api API) *httpapi.Mux {
	mux := httpapi.NewMux()
	if api.Health {
		mux.Handle("GET /healthz", r.health)
		if api.Readiness != nil {
			mux.Handle("GET /readyz", api.Readiness)
		} else {
			mux.Handle("GET /readyz", r.health)
		}
		mux.Handle("GET /metrics", r.health)
	}
	if api.OpenAPI != nil {
		mux.Handle("GET "+httpapi.OpenAPIPath, httpapi.OpenAPIHandler(api.OpenAPI))
	}
	if api.Handler != nil {
		// Another method on the runner's own paths is a 405, not the API's 404.
		for _, p := range mux.Routes() { // the runner's alone: the API is not mounted yet
			if path, ok := strings.CutPrefix(p, "GET "); ok {
				mux.OnlyGET(path)
			}
		}
		mux.Handle("/", api.Handler)
	}
	return mux
}

// API is one HTTP API to serve.
type API struct {
	Name    string       // for logs and errors ("admin")
	Addr    string       // host:port
	Handler http.Handler // the API's routes; nil serves only the health endpoints
	// Metrics names the request metrics, e.g. floodgate_adjuster_admin
	// (<prefix>_requests_total{route,code}, …); "" registers none.
	Metrics string
	// AccessLog logs every request (off for hot paths).
	AccessLog bool
	// Health mounts /healthz, /readyz and /metrics (the service's main port).
	Health bool
	// Readiness, when set, answers /readyz instead of the runner's plain
	// "ok": a service with more to say (the limiter: Redis shards, journal)
	// keeps it in step with the runner through an OnReady hook.
	Readiness http.Handler
	// OpenAPI is the API's OpenAPI document (JSON, schemas/openapi), served
	// at httpapi.OpenAPIPath; nil serves none.
	OpenAPI []byte
	// MaxBody caps request bodies (0: httpapi.DefaultMaxBody).
	MaxBody int64
	// Server overrides the runner's FLOODGATE_HTTP_* settings when not nil.
	Server *httpapi.ServerConfig
	// Conns, when Metrics is "", counts the listener's open connections
	// alone (httpapi.NewConnMetrics): a hot path without request metrics.
	Conns *httpapi.Metrics
	// Fast, when not nil, serves the API on fasthttp instead of net/http
	// (httpapi.ServerConfig.NewFastServer): these routes natively, every
	// other request as net/http would serve it. With tracing on the
	// routes are not served natively (their spans need net/http's chain).
	Fast []httpapi.FastRoute
}

// Serve listens on api.Addr now (so a port in use fails start-up) and
// serves api through httpapi.Middleware once Run starts, with the
// server timeouts and connection limit. It returns the bound address. With
// tracing on, every request but the probes is a server span named after the
// route it matched ("POST /v1/check"), carrying its correlation id.

func (r *Runner) Serve(api API) (net.Addr, error) {
	sc := r.cfg.HTTP
	if api.Server != nil {
		sc = *api.Server
	}
	var m *httpapi.Metrics
	if api.Metrics != "" {
		if m = r.metrics[api.Metrics]; m == nil {
			m = httpapi.NewMetrics(r.env.Registry, api.Metrics)
			r.metrics[api.Metrics] = m
		}
	}
	lm := m
	if lm == nil {
		lm = api.Conns
	}
	ln, err := sc.Listen(api.Addr, lm)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", api.Name, err)
	}
	var h http.Handler = api.Handler
	if api.Health || api.OpenAPI != nil {
		h = r.Mount(api)
	}
	if r.env.Tracing.Enabled() {
		h = routeSpan(h)
	}
	o := httpapi.Options{Log: r.env.Log, Metrics: m, AccessLog: api.AccessLog, MaxBody: api.MaxBody}
	h = httpapi.Middleware(o, h)
	h = r.env.Tracing.Handler(h) // outermost: the server span, continuing the caller's traceparent
	if api.Fast != nil {
		routes := api.Fast
		if r.env.Tracing.Enabled() {
			routes = nil
		}
		srv := sc.NewFastServer(routes, h, o, r.env.Log)
		r.Listener(api.Name, func() error { return httpapi.ServeFast(srv, ln) },
			func(ctx context.Context) error { return httpapi.ShutdownFast(ctx, srv) })
		return ln.Addr(), nil
	}
	srv := sc.NewServer(h, r.env.Log)
	r.HTTPServer(api.Name, srv, ln)
	return ln.Addr(), nil
}

// routeSpan names the request's server span after the route the mux in h
// matched (the span starts before it is known) and tags it with the
// request's correlation id.
func routeSpan(h http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		h.ServeHTTP(w, req)
		span := trace.SpanFromContext(req.Context())
		if id := httpapi.RequestID(req.Context()); id != "" {
			span.SetAttributes(attribute.String(tracing.AttrRequestID, id))
		}
		if _, route, ok := strings.Cut(req.Pattern, " "); ok && route != "/" {
			span.SetName(req.Method + " " + route)
			span.SetAttributes(semconv.HTTPRoute(route))
		}
	})
}

// HTTPServer runs srv on ln as a listener: stopped first, in-flight requests
// finished before the deadline.
func (r *Runner) HTTPServer(name string, srv *http.Server, ln net.Listener) {
	r.Listener(name, func() error { return httpapi.Serve(srv, ln) },
		func(ctx context.Context) error { return httpapi.Shutdown(ctx, srv) })
}

// Listener runs serve until stop is called at the start of the drain; stop
// must make serve return and finish in-flight work before its ctx ends.
func (r *Runner) Listener(name string, serve func() error, stop func(ctx context.Context) error) {
	r.add(&part{name: name, run: func(context.Context) error { return serve() }, stop: stop, stage: stageFront})
}

// Worker runs run until its ctx ends at the start of the drain: a consumer
// stops fetching, finishes and commits what it holds, then returns.
func (r *Runner) Worker(name string, run func(ctx context.Context) error) {
	r.add(&part{name: name, run: run, stage: stageFront})
}

// Tail runs run until its ctx ends once the listeners and workers have
// drained: producers and flushers that must outlive them to get the last
// output out.
func (r *Runner) Tail(name string, run func(ctx context.Context) error) {
	r.add(&part{name: name, run: run, stage: stageTail})
}

// Closer is called after every part stopped, last added first.
func (r *Runner) Closer(name string, fn func() error) {
	r.closers = append(r.closers, namedCloser{name: name, fn: fn})
}

func (r *Runner) add(p *part) {
	if r.started.Load() {
		panic("service: part " + p.name + " added after Run")
	}
	p.done = make(chan struct{})
	r.parts = append(r.parts, p)
}

// Run starts every part, marks the service ready and runs until ctx is done
// or a part fails, then drains (see Runner). It returns the first part's
// failure, joined with ErrShutdownTimeout naming what was still running.
func (r *Runner) Run(ctx context.Context) error {
	if r.started.Swap(true) {
		return errors.New("service: Run called twice")
	}
	log := r.env.Log
	frontCtx, stopFront := context.WithCancel(context.WithoutCancel(ctx))
	tailCtx, stopTail := context.WithCancel(context.WithoutCancel(ctx))
	defer stopFront()
	defer stopTail()

	failed := make(chan *part, len(r.parts))
	for _, p := range r.parts {
		pctx := frontCtx
		if p.stage == stageTail {
			pctx = tailCtx
		}
		go func() {
			defer close(p.done)
			defer func() {
				if v := recover(); v != nil {
					p.err = fmt.Errorf("%s: panic: %v", p.name, v)
				}
			}()
			p.err = p.run(pctx)
			failed <- p // early return (error or not) while serving starts the drain
		}()
	}
	r.setReady(true)
	log.Info(r.env.Name+" running", "parts", len(r.parts))

	var cause error
	var first *part
	select {
	case <-ctx.Done():
	case p := <-failed:
		first = p
		cause = fmt.Errorf("%s stopped: %w", p.name, orStopped(p.err))
		log.Error("part stopped; shutting down", "part", p.name, "err", p.err)
	}

	// Drain.
	r.setReady(false)
	start := time.Now()
	deadline, cancel := context.WithTimeout(context.WithoutCancel(ctx), r.cfg.ShutdownTimeout)
	defer cancel()
	log.Info(r.env.Name+" draining", "deadline", r.cfg.ShutdownTimeout.String())

	var stopErrs []error
	var wg sync.WaitGroup
	var mu sync.Mutex
	for _, p := range r.parts {
		if p.stage == stageFront && p.stop != nil {
			wg.Go(func() {
				if err := p.stop(deadline); err != nil && !errors.Is(err, context.DeadlineExceeded) {
					mu.Lock()
					stopErrs = append(stopErrs, fmt.Errorf("stop %s: %w", p.name, err))
					mu.Unlock()
				}
			})
		}
	}
	stopFront()
	late := r.wait(deadline, stageFront)
	wg.Wait()
	stopTail()
	late = append(late, r.wait(deadline, stageTail)...)

	for i := len(r.closers) - 1; i >= 0; i-- {
		c := r.closers[i]
		if err := c.fn(); err != nil {
			stopErrs = append(stopErrs, fmt.Errorf("close %s: %w", c.name, err))
		}
	}

	var errs []error
	if cause != nil {
		errs = append(errs, cause)
	}
	for _, p := range r.parts {
		select {
		case <-p.done:
			if p.err != nil && p != first {
				errs = append(errs, fmt.Errorf("%s: %w", p.name, p.err))
			}
		default:
		}
	}
	errs = append(errs, stopErrs...)
	if len(late) > 0 {
		log.Error("shutdown deadline passed", "still_running", late, "deadline", r.cfg.ShutdownTimeout.String())
		errs = append(errs, fmt.Errorf("%w: %s", ErrShutdownTimeout, strings.Join(late, ", ")))
	}
	log.Info(r.env.Name+" stopped", "drain", time.Since(start).Round(time.Millisecond).String())
	return errors.Join(errs...)
}

// wait waits for every part of stage until the deadline and returns the
// names of those still running.
func (r *Runner) wait(deadline context.Context, s stage) []string {
	var late []string
	for _, p := range r.parts {
		if p.stage != s {
			continue
		}
		select {
		case <-p.done:
		case <-deadline.Done():
			select {
			case <-p.done:
			default:
				late = append(late, p.name)
			}
		}
	}
	slices.Sort(late)
	return late
}

func orStopped(err error) error {
	if err == nil {
		return errors.New("returned before shutdown")
	}
	return err
}
