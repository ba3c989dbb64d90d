package server

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"

	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// BenchmarkServerCheck: POST /v1/check through the server's handler in
// process (no network), decision event published to a discarding publisher,
// against the local Redis (go test -run '^$' -bench ServerCheck -benchmem
// ./pkg/limiter). Its allocs/op is the HTTP check path's cost beyond the
// engine: decode, validate, decide, encode the event and the answer. Tracing
// is off, as by default.
func BenchmarkServerCheck(b *testing.B) { benchServerCheck(b, tracing.Tracing{}) }

// BenchmarkServerCheckTraced is BenchmarkServerCheck with tracing on and
// every check sampled (the caller sends a sampled traceparent): the HTTP
// server span, the decision's create span and its traceparent header, spans
// batched to an exporter that drops them. The difference is what tracing
// costs a check.
func BenchmarkServerCheckTraced(b *testing.B) {
	tp := sdktrace.NewTracerProvider(sdktrace.WithBatcher(tracetest.NewNoopExporter()))
	b.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	benchServerCheck(b, tracing.Tracing{Provider: tp})
}

func benchServerCheck(b *testing.B, tr tracing.Tracing) {
	rdb := redistest.Client(b)
	e := limitertest.Engine(b, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000000000, period: 1s}\n", nil)
	if err := e.Load(context.Background()); err != nil {
		b.Fatal(err)
	}
	s := New(Config{Engine: e, Publisher: limitertest.DropPublisher{}, Topic: "decisions", Gateway: "bench",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Tracing: tr})
	h := tr.Handler(s.Handler())
	body := `{"principal":{"kind":"bot","id":"` + redistest.Unique(b, "bench_server") + `"},"ip":"203.0.113.7","method":"POST","route":"/channels/{channel_id}/messages","cost":1}`
	b.ReportAllocs()
	b.ResetTimer()
	for b.Loop() {
		w := httptest.NewRecorder()
		r := httptest.NewRequest(http.MethodPost, "/v1/check", strings.NewReader(body))
		if tr.Enabled() {
			r.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		}
		h.ServeHTTP(w, r)
		if w.Code != http.StatusOK {
			b.Fatalf("status %d: %s", w.Code, w.Body.String())
		}
	}
}
