package e2e

import (
	"bytes"
	"compress/gzip"
	"encoding/hex"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	collectortrace "go.opentelemetry.io/proto/otlp/collector/trace/v1"
	tracepb "go.opentelemetry.io/proto/otlp/trace/v1"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestOneTraceFromCheckToDetector: a check sent to the limiter binary with
// a traceparent becomes one trace across both services — the limiter's HTTP
// server span (the caller's child), its "create" producer span for the
// decision event, and the detector binary's "process" consumer span for
// that event (the create span's child, linked to it) — exported by both
// over OTLP/HTTP to a receiver this test runs on loopback. Only
// OTEL_EXPORTER_OTLP_ENDPOINT is set: the endpoint alone turns tracing on.
func TestOneTraceFromCheckToDetector(t *testing.T) {
	ctx := stacktest.Context(t, 2*time.Minute, "end-to-end test needs the local stack; run `make test`")
	brokers := migrationstest.Broker(t, ctx, migrations.Runner{})

	otlp := newOTLPReceiver(t)
	bin := buildServices(t)
	run := time.Now().UnixNano()
	limiterAddr, detectorAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	redisAddrs := stacktest.Local().RedisAddrs
	common := []string{
		"FLOODGATE_KAFKA_BROKERS=" + brokers, "FLOODGATE_REDIS_ADDRS=" + strings.Join(redisAddrs, ","),
		"FLOODGATE_INFLUX_URL=http://" + stacktest.FreeAddr(t), // nothing listens: counts are dropped, not the test's business
		// Only the endpoint: it alone turns tracing on (OTLP over HTTP/protobuf).
		"OTEL_EXPORTER_OTLP_ENDPOINT=" + otlp.URL,
		"OTEL_BSP_SCHEDULE_DELAY=100", // export every 100 ms instead of 5 s
	}
	stacktest.Exec(t, filepath.Join(bin, "limiter"), append(common,
		"FLOODGATE_LIMITER_ADDR="+limiterAddr, "FLOODGATE_LIMITER_GRPC_ADDR=off", "FLOODGATE_LIMITER_INFLUX_INTERVAL=0",
		"FLOODGATE_LIMITER_PRINCIPAL_LIMIT=100",
	))
	stacktest.Exec(t, filepath.Join(bin, "detector"), append(common,
		"FLOODGATE_DETECTOR_ADDR="+detectorAddr, fmt.Sprintf("FLOODGATE_DETECTOR_GROUP=e2e-trace-%d", run),
		"FLOODGATE_DETECTOR_RECORDS=off",
	))
	waitReady(t, "http://"+limiterAddr+"/readyz")
	waitReady(t, "http://"+detectorAddr+"/readyz")

	// The gateway's span: the limiter must continue it.
	traceID, parentID := "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
	body := fmt.Sprintf(`{"principal":{"kind":"bot","id":"e2e_trace_%d"},"ip":"203.0.113.9","method":"POST","route":"/channels/{channel_id}/messages"}`, run)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+limiterAddr+"/v1/check", strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("traceparent", "00-"+traceID+"-"+parentID+"-01")
	req.Header.Set("tracestate", "gw=e2e")
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	answer, _ := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.Equal(t, http.StatusOK, resp.StatusCode, "%s", answer)

	var server, create, process *span
	if !assert.Eventually(t, func() bool {
		server = otlp.find(traceID, "limiter", tracepb.Span_SPAN_KIND_SERVER, "POST /v1/check")
		create = otlp.find(traceID, "limiter", tracepb.Span_SPAN_KIND_PRODUCER, "create floodgate.decisions.v1")
		process = otlp.find(traceID, "detector", tracepb.Span_SPAN_KIND_CONSUMER, "process floodgate.decisions.v1")
		return server != nil && create != nil && process != nil
	}, 30*time.Second, 100*time.Millisecond) {
		t.Fatalf("trace %s: server span %v, create span %v, process span %v; received:%s", traceID, server != nil, create != nil, process != nil, otlp)
	}

	require.Equal(t, parentID, server.parent, "the limiter's server span is the caller's child")
	require.Equal(t, "gw=e2e", server.TraceState, "the caller's tracestate is kept")
	require.Equal(t, server.id, create.parent, "the decision's create span is the server span's child")
	require.Contains(t, string(answer), `"id":"`+create.attrs["floodgate.decision.id"]+`"`, "the create span names the decision it made")
	require.Equal(t, "kafka", create.attrs["messaging.system"])
	require.Equal(t, create.id, process.parent, "the detector's process span is the create span's child")
	require.Contains(t, process.links, create.id, "and links the decision's creation context")
	require.Equal(t, create.attrs["floodgate.decision.id"], process.attrs["messaging.message.id"])
	require.Equal(t, "floodgate.decisions.v1", process.attrs["messaging.destination.name"])
	require.Equal(t, fmt.Sprintf("e2e-trace-%d", run), process.attrs["messaging.consumer.group.name"])
}

// span is one received span, its ids in hex.
type span struct {
	*tracepb.Span
	service, trace, id, parent string
	links                      []string
	attrs                      map[string]string
}

// otlpReceiver is an OTLP/HTTP traces endpoint (POST /v1/traces, protobuf).
type otlpReceiver struct {
	*httptest.Server
	mu    sync.Mutex
	spans []*span
}

func newOTLPReceiver(t *testing.T) *otlpReceiver {
	r := &otlpReceiver{}
	r.Server = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, req *http.Request) {
		if req.Method != http.MethodPost || req.URL.Path != "/v1/traces" {
			http.NotFound(w, req)
			return
		}
		var body io.Reader = req.Body
		if req.Header.Get("Content-Encoding") == "gzip" {
			gz, err := gzip.NewReader(req.Body)
			if err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			body = gz
		}
		raw, err := io.ReadAll(body)
		var export collectortrace.ExportTraceServiceRequest
		if err == nil {
			err = proto.Unmarshal(raw, &export)
		}
		if err != nil {
			http.Error(w, err.Error(), http.StatusBadRequest)
			return
		}
		r.add(&export)
		out, _ := proto.Marshal(&collectortrace.ExportTraceServiceResponse{})
		w.Header().Set("Content-Type", "application/x-protobuf")
		_, _ = w.Write(out)
	}))
	t.Cleanup(r.Close)
	return r
}

func (r *otlpReceiver) add(export *collectortrace.ExportTraceServiceRequest) {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, rs := range export.GetResourceSpans() {
		service := ""
		for _, kv := range rs.GetResource().GetAttributes() {
			if kv.GetKey() == "service.name" {
				service = kv.GetValue().GetStringValue()
			}
		}
		for _, ss := range rs.GetScopeSpans() {
			for _, s := range ss.GetSpans() {
				sp := &span{Span: s, service: service, trace: hex.EncodeToString(s.GetTraceId()),
					id: hex.EncodeToString(s.GetSpanId()), parent: hex.EncodeToString(s.GetParentSpanId()), attrs: map[string]string{}}
				for _, l := range s.GetLinks() {
					sp.links = append(sp.links, hex.EncodeToString(l.GetSpanId()))
				}
				for _, kv := range s.GetAttributes() {
					v := kv.GetValue()
					switch {
					case v.GetStringValue() != "":
						sp.attrs[kv.GetKey()] = v.GetStringValue()
					default:
						sp.attrs[kv.GetKey()] = fmt.Sprint(v.GetValue())
					}
				}
				r.spans = append(r.spans, sp)
			}
		}
	}
}

// find returns the span of trace by service, kind and name, or nil.
func (r *otlpReceiver) find(trace, service string, kind tracepb.Span_SpanKind, name string) *span {
	r.mu.Lock()
	defer r.mu.Unlock()
	for _, s := range r.spans {
		if s.trace == trace && s.service == service && s.GetKind() == kind && s.GetName() == name {
			return s
		}
	}
	return nil
}

// String lists what was received, for a failure message.
func (r *otlpReceiver) String() string {
	r.mu.Lock()
	defer r.mu.Unlock()
	var b bytes.Buffer
	for _, s := range r.spans {
		fmt.Fprintf(&b, "\n  %s %s %q trace=%s id=%s parent=%s links=%v", s.service, s.GetKind(), s.GetName(), s.trace, s.id, s.parent, s.links)
	}
	return b.String()
}
