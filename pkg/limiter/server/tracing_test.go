package server_test

import (
	"context"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/limiter/limitertest"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

const callerTrace, callerSpan = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"

func tracedServer(t *testing.T, tr tracing.Tracing) (*server.Server, *kafkatest.Capture) {
	rdb := redistest.Client(t)
	e := limitertest.Engine(t, rdb, "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000, period: 1m}\n", nil)
	pub := &kafkatest.Capture{}
	s := server.New(server.Config{Engine: e, Publisher: pub, Topic: "decisions", Gateway: "trace-test",
		Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry(), Tracing: tr})
	s.SetReady(true)
	return s, pub
}

func recorder(t *testing.T) (tracing.Tracing, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tracing.Tracing{Provider: tp}, rec
}

// requireEventContinues checks that msg carries the context of a "create
// decisions" span that is parent's child and names the decision.
func requireEventContinues(t *testing.T, rec *tracetest.SpanRecorder, msg kafka.Message, parent trace.SpanContext) {
	t.Helper()
	carried := trace.SpanContextFromContext(stream.ExtractTrace(context.Background(), tracing.DefaultPropagator(), msg))
	require.True(t, carried.IsValid(), "the decision event carries a traceparent")
	require.Equal(t, callerTrace, carried.TraceID().String())
	var create sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		if s.SpanContext().SpanID() == carried.SpanID() {
			create = s
		}
	}
	require.NotNil(t, create, "the traceparent names a span of this process")
	require.Equal(t, "create decisions", create.Name())
	require.Equal(t, trace.SpanKindProducer, create.SpanKind())
	require.Equal(t, parent.SpanID(), create.Parent().SpanID())
	attrs := map[string]string{}
	for _, kv := range create.Attributes() {
		attrs[string(kv.Key)] = kv.Value.Emit()
	}
	var ceID string
	for _, h := range msg.Headers {
		if h.Key == stream.HeaderCEID {
			ceID = string(h.Value)
		}
	}
	require.Equal(t, ceID, attrs[tracing.AttrDecisionID])
	require.Equal(t, ceID, attrs["messaging.message.id"])
	require.Equal(t, "true", attrs[tracing.AttrAllowed])
	require.Equal(t, "principal", attrs[tracing.AttrTier])
}

// serverSpan waits for the server span called name (it ends after the
// answer went out) and checks it continues the caller's trace.
func serverSpan(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	var found sdktrace.ReadOnlySpan
	require.Eventually(t, func() bool {
		for _, s := range rec.Ended() {
			if s.SpanKind() == trace.SpanKindServer && s.Name() == name {
				found = s
				return true
			}
		}
		return false
	}, 5*time.Second, 5*time.Millisecond, "no server span "+name)
	require.Equal(t, callerTrace, found.SpanContext().TraceID().String())
	require.Equal(t, callerSpan, found.Parent().SpanID().String(), "the caller's traceparent is the server span's parent")
	return found
}

// TestBatchDecisionsContinueTheCallersTrace: each check of a batch is a
// create span under the batch request's server span, and each decision
// event carries its own span's context.
func TestBatchDecisionsContinueTheCallersTrace(t *testing.T) {
	tr, rec := recorder(t)
	s, pub := tracedServer(t, tr)
	srv := httptest.NewServer(tr.Handler(s.Handler()))
	defer srv.Close()
	id := redistest.Unique(t, "bot")
	check := `{"principal":{"kind":"bot","id":"` + id + `"},"ip":"203.0.113.7","method":"GET","route":"/x"}`
	req, err := http.NewRequest(http.MethodPost, srv.URL+"/v1/check/batch", strings.NewReader(`{"checks":[`+check+`,`+check+`]}`))
	require.NoError(t, err)
	req.Header.Set("traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode)

	span := serverSpan(t, rec, "POST /v1/check/batch")
	require.Len(t, pub.Messages(), 2)
	require.NotEqual(t, pub.Messages()[0].Headers, pub.Messages()[1].Headers)
	for _, m := range pub.Messages() {
		requireEventContinues(t, rec, m, span.SpanContext())
	}
}

// TestEnvoyDecisionsContinueTheCallersTrace: Envoy's traceparent metadata
// is the gRPC server span's parent, and the decision is its child.
func TestEnvoyDecisionsContinueTheCallersTrace(t *testing.T) {
	tr, rec := recorder(t)
	s, pub := tracedServer(t, tr)
	g, hs := envoyrls.NewGRPCServer(s)
	envoyrls.SetServing(hs, true)
	conn := limitertest.DialGRPC(t, g)
	ctx := metadata.AppendToOutgoingContext(context.Background(), "traceparent", "00-"+callerTrace+"-"+callerSpan+"-01")
	r, err := rlsv3.NewRateLimitServiceClient(conn).ShouldRateLimit(ctx, &rlsv3.RateLimitRequest{Domain: "d",
		Descriptors: []*rlcommon.RateLimitDescriptor{limitertest.BotDescriptor(redistest.Unique(t, "envoy_trace"))}})
	require.NoError(t, err)
	require.Equal(t, rlsv3.RateLimitResponse_OK, r.GetOverallCode())

	span := serverSpan(t, rec, "envoy.service.ratelimit.v3.RateLimitService/ShouldRateLimit")
	require.Len(t, pub.Messages(), 1)
	requireEventContinues(t, rec, pub.Messages()[0], span.SpanContext())
}

// TestUntracedDecisionsCarryNoTraceContext: tracing off, a traceparent
// sent by the caller does not reach the decision event.
func TestUntracedDecisionsCarryNoTraceContext(t *testing.T) {
	s, pub := tracedServer(t, tracing.Tracing{})
	srv := httptest.NewServer(s.Handler())
	defer srv.Close()
	body := `{"principal":{"kind":"bot","id":"` + redistest.Unique(t, "bot") + `"},"ip":"203.0.113.7","method":"GET","route":"/x"}`
	resp, _ := limitertest.Post(t, srv.URL, body, map[string]string{"traceparent": "00-" + callerTrace + "-" + callerSpan + "-01"})
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.Len(t, pub.Messages(), 1)
	for _, h := range pub.Messages()[0].Headers {
		require.NotEqual(t, stream.HeaderTraceparent, h.Key)
	}
}
