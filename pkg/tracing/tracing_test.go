package tracing

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

type handler struct{ calls int }

func (h *handler) ServeHTTP(http.ResponseWriter, *http.Request) { h.calls++ }

// TestOffWrapsNothing: the zero Tracing hands back the very handler and
// transport it was given and adds no gRPC option, so a service without
// tracing runs the code it ran before tracing existed.
func TestOffWrapsNothing(t *testing.T) {
	var off Tracing
	require.False(t, off.Enabled())
	h := &handler{}
	require.Same(t, h, off.Handler(h).(*handler))
	rt := &http.Transport{}
	require.Same(t, rt, off.Transport(rt).(*http.Transport))
	require.Nil(t, off.GRPCServerOptions())
	_, span := off.Tracer().Start(t.Context(), "x")
	require.False(t, span.IsRecording(), "off, the tracer is a no-op")
}

// TestOnSkipsProbes: on, API requests are spans and the probes are not.
func TestOnSkipsProbes(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	on := Tracing{Provider: sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))}
	require.True(t, on.Enabled())
	require.Len(t, on.GRPCServerOptions(), 1)
	h := &handler{}
	wrapped := on.Handler(h)
	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/v1/check"} {
		wrapped.ServeHTTP(httptest.NewRecorder(), httptest.NewRequest(http.MethodGet, path, nil))
	}
	require.Equal(t, 4, h.calls)
	require.Len(t, rec.Ended(), 1)
	require.Equal(t, "GET", rec.Ended()[0].Name(), "no route matched here: the method alone")
}
