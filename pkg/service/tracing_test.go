package service

import (
	"context"
	"encoding/hex"
	"io"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/promtest"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

func TestTracingConfigFromEnv(t *testing.T) {
	for _, tc := range []struct {
		name    string
		env     map[string]string
		on      bool
		check   func(t *testing.T, c TracingConfig)
		wantErr string
	}{
		{name: "nothing set: off", env: nil},
		{name: "sampler alone: still off", env: map[string]string{"OTEL_TRACES_SAMPLER": "always_on"}},
		{name: "endpoint turns OTLP over HTTP on, /v1/traces appended",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4318/"}, on: true,
			check: func(t *testing.T, c TracingConfig) {
				require.Equal(t, []string{"otlp"}, c.Exporters)
				require.Equal(t, "http/protobuf", c.Protocol)
				require.Equal(t, "http://127.0.0.1:4318/v1/traces", c.Endpoint)
				require.Equal(t, "limiter", c.ServiceName, "the service's own name by default")
			}},
		{name: "traces endpoint used as given, over the base endpoint",
			env: map[string]string{"OTEL_EXPORTER_OTLP_TRACES_ENDPOINT": "https://collector:4318/custom", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://ignored:1"}, on: true,
			check: func(t *testing.T, c TracingConfig) { require.Equal(t, "https://collector:4318/custom", c.Endpoint) }},
		{name: "grpc protocol",
			env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:4317", "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}, on: true,
			check: func(t *testing.T, c TracingConfig) {
				require.Equal(t, "grpc", c.Protocol)
				require.Equal(t, "http://127.0.0.1:4317", c.Endpoint)
			}},
		{name: "exporter named without endpoint: the exporter's default",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp,console"}, on: true,
			check: func(t *testing.T, c TracingConfig) {
				require.Equal(t, []string{"otlp", "console"}, c.Exporters)
				require.Empty(t, c.Endpoint)
			}},
		{name: "none wins over an endpoint", env: map[string]string{"OTEL_TRACES_EXPORTER": "none", "OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1"}},
		{name: "OTEL_SDK_DISABLED wins over everything", env: map[string]string{"OTEL_SDK_DISABLED": "true", "OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "bogus"}},
		{name: "service name: OTEL_SERVICE_NAME over resource attributes",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_SERVICE_NAME": "edge-limiter", "OTEL_RESOURCE_ATTRIBUTES": "service.name=x,deployment.environment=prod%20eu"}, on: true,
			check: func(t *testing.T, c TracingConfig) {
				require.Equal(t, "edge-limiter", c.ServiceName)
				require.Equal(t, map[string]string{"deployment.environment": "prod eu"}, c.Attributes)
			}},
		{name: "service name from resource attributes",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_RESOURCE_ATTRIBUTES": "service.name=lim-a"}, on: true,
			check: func(t *testing.T, c TracingConfig) { require.Equal(t, "lim-a", c.ServiceName) }},
		{name: "ratio sampler",
			env: map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "0.25"}, on: true,
			check: func(t *testing.T, c TracingConfig) {
				require.Contains(t, c.Sampler.Description(), "TraceIDRatioBased{0.25}")
			}},
		{name: "unknown exporter", env: map[string]string{"OTEL_TRACES_EXPORTER": "jaeger"}, wantErr: "OTEL_TRACES_EXPORTER"},
		{name: "http/json", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "http://x:1", "OTEL_EXPORTER_OTLP_PROTOCOL": "http/json"}, wantErr: "OTEL_EXPORTER_OTLP_PROTOCOL"},
		{name: "endpoint without scheme", env: map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": "collector:4318"}, wantErr: "OTEL_EXPORTER_OTLP_ENDPOINT"},
		{name: "sampler", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "sometimes"}, wantErr: "OTEL_TRACES_SAMPLER"},
		{name: "sampler arg", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_TRACES_SAMPLER": "traceidratio", "OTEL_TRACES_SAMPLER_ARG": "2"}, wantErr: "OTEL_TRACES_SAMPLER_ARG"},
		{name: "propagator", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_PROPAGATORS": "b3"}, wantErr: "OTEL_PROPAGATORS"},
		{name: "resource attributes", env: map[string]string{"OTEL_TRACES_EXPORTER": "otlp", "OTEL_RESOURCE_ATTRIBUTES": "novalue"}, wantErr: "OTEL_RESOURCE_ATTRIBUTES"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := TracingConfigFromEnv(func(k string) string { return tc.env[k] }, "limiter")
			if tc.wantErr != "" {
				require.ErrorContains(t, err, tc.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tc.on, c.Enabled())
			if tc.check != nil {
				tc.check(t, c)
			}
			tr, shutdown, err := StartTracing(context.Background(), c, io.Discard)
			require.NoError(t, err)
			require.Equal(t, tc.on, tr.Enabled(), "off builds no provider")
			require.NoError(t, shutdown(context.Background()))
		})
	}
}

// TestServeMakesServerSpans: with tracing on, a request to a Runner's API
// is a server span named after its route, the caller's traceparent its
// parent, carrying the correlation id; probes make none.
func TestServeMakesServerSpans(t *testing.T) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	env := Env{Name: "test", Log: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Tracing: tracing.Tracing{Provider: tp}}
	r := NewRunnerWith(env, RunnerConfig{ShutdownTimeout: 5 * time.Second, HTTP: httpapi.DefaultServerConfig()})
	var inner trace.SpanContext
	mux := http.NewServeMux()
	mux.HandleFunc("GET /things/{id}", func(w http.ResponseWriter, r *http.Request) { inner = trace.SpanContextFromContext(r.Context()) })
	addr, err := r.Serve(API{Name: "api", Addr: "127.0.0.1:0", Handler: mux, Health: true, Metrics: "floodgate_test_api"})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	defer func() { cancel(); <-done }()
	require.Eventually(t, r.Ready, 5*time.Second, 10*time.Millisecond)

	for _, path := range []string{"/healthz", "/readyz", "/metrics", "/things/42"} {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addr.String()+path, nil)
		req.Header.Set("traceparent", "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01")
		req.Header.Set(httpapi.HeaderRequestID, "req-1")
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode, path)
	}
	require.Eventually(t, func() bool { return len(rec.Ended()) > 0 }, 5*time.Second, 5*time.Millisecond, "the span ends after the answer went out")
	spans := rec.Ended()
	require.Len(t, spans, 1, "only the API request is traced, not the probes")
	s := spans[0]
	require.Equal(t, "GET /things/{id}", s.Name())
	require.Equal(t, trace.SpanKindServer, s.SpanKind())
	require.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", s.SpanContext().TraceID().String())
	require.Equal(t, "00f067aa0ba902b7", s.Parent().SpanID().String())
	require.Equal(t, s.SpanContext().SpanID(), inner.SpanID(), "the handler runs inside the server span")
	attrs := map[string]string{}
	for _, kv := range s.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	require.Equal(t, "req-1", attrs[tracing.AttrRequestID])
	require.Equal(t, "/things/{id}", attrs["http.route"])

	// The request metrics still see the route (the span wrapper must not hide it).
	require.NotZero(t, promtest.Value(t, env.Registry, "floodgate_test_api_requests_total", map[string]string{"route": "GET /things/{id}"}))
}

// TestExecFlushesSpansOnExit: a service run by Exec with only
// OTEL_EXPORTER_OTLP_ENDPOINT set exports its spans over OTLP/HTTP, the
// last ones flushed as it exits (the batch delay, 5 s, has not passed), with
// service.name from OTEL_SERVICE_NAME.
func TestExecFlushesSpansOnExit(t *testing.T) {
	var mu sync.Mutex
	var got []*collectortrace.ExportTraceServiceRequest
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		raw, _ := io.ReadAll(r.Body)
		var req collectortrace.ExportTraceServiceRequest
		if r.URL.Path != "/v1/traces" || proto.Unmarshal(raw, &req) != nil {
			http.Error(w, "bad export", http.StatusBadRequest)
			return
		}
		mu.Lock()
		got = append(got, &req)
		mu.Unlock()
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	defer collector.Close()
	env := map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": collector.URL, "OTEL_SERVICE_NAME": "flush-test"}
	var traceID string
	code := Exec(context.Background(), "svc", func(ctx context.Context, env Env) error {
		if !env.Tracing.Enabled() {
			return nil
		}
		_, span := env.Tracing.Tracer().Start(ctx, "work")
		traceID = span.SpanContext().TraceID().String()
		span.End()
		return nil
	}, Stdio{Getenv: func(k string) string { return env[k] }, Stdout: io.Discard, Stderr: io.Discard})
	require.Equal(t, 0, code)
	require.NotEmpty(t, traceID, "the endpoint turned tracing on")
	mu.Lock()
	defer mu.Unlock()
	require.Len(t, got, 1, "the span was exported once, at exit")
	rs := got[0].GetResourceSpans()[0]
	var service string
	for _, kv := range rs.GetResource().GetAttributes() {
		if kv.GetKey() == "service.name" {
			service = kv.GetValue().GetStringValue()
		}
	}
	require.Equal(t, "flush-test", service)
	s := rs.GetScopeSpans()[0].GetSpans()[0]
	require.Equal(t, "work", s.GetName())
	require.Equal(t, traceID, hex.EncodeToString(s.GetTraceId()))
	require.True(t, strings.HasPrefix(rs.GetScopeSpans()[0].GetScope().GetName(), "github.com/floodgate-dev/floodgate"))
}
