package gateway

import (
	"context"
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// TestCheckCarriesTheGatewaysTrace: with tracing on, the middleware's
// check is a span under the gateway request's own span, and the Client
// sends the limiter a traceparent in that trace (its HTTP client span).
func TestCheckCarriesTheGatewaysTrace(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	tr := tracing.Tracing{Provider: tp}

	var mu sync.Mutex
	var got string
	limiter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		got = r.Header.Get("traceparent")
		mu.Unlock()
		_ = json.NewEncoder(w).Encode(Decision{ID: "dec-1", Allowed: true, Tier: "principal", Limit: 10, Remaining: 9})
	}))
	defer limiter.Close()
	mw, err := Middleware(Options{Checker: NewClient(limiter.URL, time.Second, WithTracing(tr)), Tracing: tr})
	require.NoError(t, err)
	h := mw(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {}))

	ctx, request := tr.Tracer().Start(context.Background(), "gateway request")
	w := httptest.NewRecorder()
	h.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/x", nil).WithContext(ctx))
	request.End()
	require.Equal(t, http.StatusOK, w.Code)

	spans := map[string]sdktrace.ReadOnlySpan{}
	for _, s := range rec.Ended() {
		spans[s.Name()] = s
	}
	check := spans["floodgate.check"]
	require.NotNil(t, check, "spans: %v", spans)
	require.Equal(t, request.SpanContext().SpanID(), check.Parent().SpanID())
	attrs := map[string]string{}
	for _, kv := range check.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	require.Equal(t, "dec-1", attrs[tracing.AttrDecisionID])
	require.Equal(t, "true", attrs[tracing.AttrAllowed])
	require.Equal(t, "anonymous", attrs[tracing.AttrPrincipalKind])

	client := spans["HTTP POST"]
	require.NotNil(t, client, "the check request is a client span; spans: %v", spans)
	require.Equal(t, trace.SpanKindClient, client.SpanKind())
	require.Equal(t, check.SpanContext().SpanID(), client.Parent().SpanID())
	mu.Lock()
	defer mu.Unlock()
	require.Equal(t, "00-"+request.SpanContext().TraceID().String()+"-"+client.SpanContext().SpanID().String()+"-01", got,
		"the limiter is asked inside the gateway's trace")
}

// TestUntracedClientSendsNoTraceparent: without WithTracing the check
// request carries no trace context (and the middleware makes no span).
func TestUntracedClientSendsNoTraceparent(t *testing.T) {
	var got []string
	limiter := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got = r.Header.Values("traceparent")
		_ = json.NewEncoder(w).Encode(Decision{ID: "dec-1", Allowed: true})
	}))
	defer limiter.Close()
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	ctx, request := tp.Tracer("test").Start(context.Background(), "gateway request")
	defer request.End()
	mw, err := Middleware(Options{Checker: NewClient(limiter.URL, time.Second)})
	require.NoError(t, err)
	w := httptest.NewRecorder()
	mw(http.HandlerFunc(func(http.ResponseWriter, *http.Request) {})).ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/x", nil).WithContext(ctx))
	require.Equal(t, http.StatusOK, w.Code)
	require.Empty(t, got)
	require.Empty(t, rec.Ended())
}
