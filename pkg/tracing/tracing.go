// Package tracing is what Floodgate's components need to make OpenTelemetry
// spans: the tracer provider and propagator a service was given (Tracing),
// and the shared HTTP and gRPC instrumentation built on them. Kafka message
// spans are pkg/stream's; the provider itself is built from the OTEL_*
// variables by pkg/service.
//
// Off costs nothing. The zero Tracing is off: components check Enabled
// before they start a span, wrap a handler or touch a header, so a service
// run without tracing configured takes the same code path, with the same
// allocations, as before tracing existed. No global state is read or set.
package tracing

import (
	"net/http"
	"strings"

	"go.opentelemetry.io/contrib/instrumentation/google.golang.org/grpc/otelgrpc"
	"go.opentelemetry.io/contrib/instrumentation/net/http/otelhttp"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"
	"go.opentelemetry.io/otel/trace/noop"
	"google.golang.org/grpc"
	"google.golang.org/grpc/stats"
)

// Scope is the instrumentation scope of Floodgate's own spans.
const Scope = "github.com/floodgate-dev/floodgate"

// Floodgate's own span attributes.
const (
	AttrRequestID     = "floodgate.request_id"       // the correlation id (X-Request-Id)
	AttrDecisionID    = "floodgate.decision.id"      // the decision event's id
	AttrAllowed       = "floodgate.decision.allowed" // the limiter's answer
	AttrTier          = "floodgate.decision.tier"    // the deciding tier
	AttrPrincipalKind = "floodgate.principal.kind"   // user, bot, api_key, anonymous
	AttrDegraded      = "floodgate.decision.degraded"
	AttrAttempt       = "floodgate.attempt" // a consumer's 1-based handler attempt
)

// Tracing is a component's tracing: where spans go and how their context
// crosses process boundaries. The zero value is off.
type Tracing struct {
	// Provider makes the tracers; nil is off.
	Provider trace.TracerProvider
	// Propagator carries span context in HTTP and Kafka headers; nil is the
	// W3C trace context (traceparent, tracestate) and baggage.
	Propagator propagation.TextMapPropagator
}

// Enabled reports whether spans are made.
func (t Tracing) Enabled() bool { return t.Provider != nil }

// Tracer is Floodgate's tracer on t's provider (a no-op tracer when off).
func (t Tracing) Tracer() trace.Tracer {
	if t.Provider == nil {
		return noop.NewTracerProvider().Tracer(Scope)
	}
	return t.Provider.Tracer(Scope)
}

// Propagators is t's propagator, W3C trace context and baggage by default.
func (t Tracing) Propagators() propagation.TextMapPropagator {
	if t.Propagator == nil {
		return DefaultPropagator()
	}
	return t.Propagator
}

// DefaultPropagator is W3C trace context (traceparent, tracestate) and W3C
// baggage, OTEL_PROPAGATORS' default.
func DefaultPropagator() propagation.TextMapPropagator {
	return propagation.NewCompositeTextMapPropagator(propagation.TraceContext{}, propagation.Baggage{})
}

// untraced are the paths that never get a span: probes and scrapes.
var untraced = map[string]bool{"/healthz": true, "/readyz": true, "/metrics": true}

// Handler wraps h so that every request but the health and metrics probes
// is an HTTP server span named after its route ("POST /v1/check"), the child
// of an incoming traceparent. Off, it returns h itself. The route is known
// only when h is (or directly wraps) the http.ServeMux that matched it.
func (t Tracing) Handler(h http.Handler) http.Handler {
	if !t.Enabled() {
		return h
	}
	return otelhttp.NewHandler(h, "http",
		otelhttp.WithTracerProvider(t.Provider),
		otelhttp.WithPropagators(t.Propagators()),
		otelhttp.WithFilter(func(r *http.Request) bool { return !untraced[r.URL.Path] }),
	)
}

// Transport wraps rt (nil: http.DefaultTransport) so every request is an
// HTTP client span whose context goes out in the request's traceparent. Off,
// it returns rt itself.
func (t Tracing) Transport(rt http.RoundTripper) http.RoundTripper {
	if rt == nil {
		rt = http.DefaultTransport
	}
	if !t.Enabled() {
		return rt
	}
	return otelhttp.NewTransport(rt, otelhttp.WithTracerProvider(t.Provider), otelhttp.WithPropagators(t.Propagators()))
}

// GRPCServerOptions are the server options that make every RPC but gRPC
// health checks a gRPC server span, the child of the caller's traceparent
// metadata; none when off.
func (t Tracing) GRPCServerOptions() []grpc.ServerOption {
	if !t.Enabled() {
		return nil
	}
	return []grpc.ServerOption{grpc.StatsHandler(t.GRPCStatsHandler())}
}

// GRPCStatsHandler is the stats handler GRPCServerOptions installs, for a
// server that takes one directly (pkg/grpcfast); nil when off.
func (t Tracing) GRPCStatsHandler() stats.Handler {
	if !t.Enabled() {
		return nil
	}
	return otelgrpc.NewServerHandler(
		otelgrpc.WithTracerProvider(t.Provider),
		otelgrpc.WithPropagators(t.Propagators()),
		otelgrpc.WithFilter(func(info *stats.RPCTagInfo) bool {
			return !strings.HasPrefix(info.FullMethodName, "/grpc.health.v1.Health/")
		}),
	)
}
