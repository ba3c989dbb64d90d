package stream

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// recording is tracing on, every span kept in memory.
func recording(t *testing.T) (tracing.Tracing, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	t.Cleanup(func() { _ = tp.Shutdown(context.Background()) })
	return tracing.Tracing{Provider: tp}, rec
}

func spanNamed(t *testing.T, rec *tracetest.SpanRecorder, name string) sdktrace.ReadOnlySpan {
	t.Helper()
	for _, s := range rec.Ended() {
		if s.Name() == name {
			return s
		}
	}
	names := []string{}
	for _, s := range rec.Ended() {
		names = append(names, s.Name())
	}
	require.FailNow(t, "no span named "+name, "ended spans: %v", names)
	return nil
}

func TestTraceHeadersInjectAndExtract(t *testing.T) {
	tr, _ := recording(t)
	ctx, span := tr.Tracer().Start(context.Background(), "request")
	defer span.End()
	want := span.SpanContext()

	t.Run("inject beside the CloudEvents headers, caller's slice untouched", func(t *testing.T) {
		ce := CloudEventHeaders("decision.v1", "id-1", "test", time.Now())
		orig := append([]kafka.Header(nil), ce...)
		out := InjectTrace(ctx, tr.Propagators(), ce)
		require.Equal(t, orig, ce, "the caller's headers are not modified")
		got := kafkatest.Headers(out)
		require.Equal(t, "id-1", got[HeaderCEID], "the CloudEvents headers stay")
		require.Equal(t, "00-"+want.TraceID().String()+"-"+want.SpanID().String()+"-01", got[HeaderTraceparent])

		back := trace.SpanContextFromContext(ExtractTrace(context.Background(), tr.Propagators(), kafka.Message{Headers: out}))
		require.True(t, back.IsRemote())
		require.Equal(t, want.TraceID(), back.TraceID())
		require.Equal(t, want.SpanID(), back.SpanID())
		require.True(t, back.IsSampled())
	})
	t.Run("an existing traceparent is replaced in a copy", func(t *testing.T) {
		old := []kafka.Header{{Key: HeaderTraceparent, Value: []byte("00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01")}}
		out := InjectTrace(ctx, tr.Propagators(), old)
		require.Equal(t, "00-0af7651916cd43dd8448eb211c80319c-b7ad6b7169203331-01", string(old[0].Value))
		require.Len(t, out, 1)
		require.Contains(t, string(out[0].Value), want.TraceID().String())
	})
	t.Run("tracestate travels too", func(t *testing.T) {
		ts, err := trace.ParseTraceState("vendor=abc")
		require.NoError(t, err)
		sctx := trace.ContextWithSpanContext(context.Background(), want.WithTraceState(ts))
		out := InjectTrace(sctx, tr.Propagators(), nil)
		require.Equal(t, "vendor=abc", kafkatest.Headers(out)[HeaderTracestate])
		back := trace.SpanContextFromContext(ExtractTrace(context.Background(), tr.Propagators(), kafka.Message{Headers: out}))
		require.Equal(t, "vendor=abc", back.TraceState().String())
	})
	t.Run("no span, no headers", func(t *testing.T) {
		require.Empty(t, InjectTrace(context.Background(), tr.Propagators(), nil))
		require.False(t, trace.SpanContextFromContext(ExtractTrace(context.Background(), tr.Propagators(), kafka.Message{})).IsValid())
	})
	t.Run("off: Create leaves the headers alone", func(t *testing.T) {
		var off *Tracer = NewTracer(tracing.Tracing{})
		require.Nil(t, off)
		hs := CloudEventHeaders("decision.v1", "id-2", "test", time.Now())
		require.Equal(t, hs, off.Create(ctx, "t", "id-2", hs))
	})
}

// TestTraceCrossesTheBroker: a message created under a request's span
// (Tracer.Create, as the limiter does) and one published under it
// (Producer.Publish) reach a consumer whose process spans continue that
// trace: children of the messages' producer spans, linked to them.
func TestTraceCrossesTheBroker(t *testing.T) {
	const topic = "traced"
	addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	tr, rec := recording(t)
	ctx, request := tr.Tracer().Start(context.Background(), "request")

	created := kafka.Message{Topic: topic, Key: []byte("a"), Value: []byte("1"),
		Headers: NewTracer(tr).Create(ctx, topic, "id-created", CloudEventHeaders("decision.v1", "id-created", "test", time.Now()))}
	p := NewProducer(ProducerConfig{Brokers: []string{addr}, Topic: topic, Tracing: tr})
	defer p.Close()
	pctx, cancel := context.WithTimeout(ctx, 20*time.Second)
	defer cancel()
	require.NoError(t, p.Publish(pctx, created))
	published := kafka.Message{Key: []byte("a"), Value: []byte("2"), Headers: CloudEventHeaders("decision.v1", "id-published", "test", time.Now())}
	require.NoError(t, p.Publish(pctx, published))
	require.NotContains(t, kafkatest.Headers(published.Headers), HeaderTraceparent, "Publish does not modify the caller's message")
	request.End()

	var mu sync.Mutex
	var handled []trace.SpanContext
	c, err := NewConsumer(func() ConsumerConfig {
		cfg := fastConsumerConfig(t, addr, topic, "traced-group", prometheus.NewRegistry())
		cfg.Tracing = tr
		return cfg
	}(), func(ctx context.Context, msg kafka.Message) error {
		mu.Lock()
		handled = append(handled, trace.SpanContextFromContext(ctx))
		mu.Unlock()
		return nil
	})
	require.NoError(t, err)
	stop := runConsumer(t, c)
	require.Eventually(t, func() bool { mu.Lock(); defer mu.Unlock(); return len(handled) == 2 }, 20*time.Second, 10*time.Millisecond)
	require.NoError(t, stop())

	create := spanNamed(t, rec, "create "+topic)
	require.Equal(t, trace.SpanKindProducer, create.SpanKind())
	require.Equal(t, request.SpanContext().SpanID(), create.Parent().SpanID(), "create is the request's child")
	var processes, sends []sdktrace.ReadOnlySpan
	for _, s := range rec.Ended() {
		switch s.Name() {
		case "process " + topic:
			processes = append(processes, s)
		case "send " + topic:
			sends = append(sends, s)
		}
	}
	require.Len(t, processes, 2)
	require.Len(t, sends, 2)
	// The first send carried the created message: its creation context stays, linked.
	require.Len(t, sends[0].Links(), 1)
	require.Equal(t, create.SpanContext().SpanID(), sends[0].Links()[0].SpanContext.SpanID())
	// Each process span is the child of its message's creation context and links it.
	for i, parent := range []trace.SpanContext{create.SpanContext(), sends[1].SpanContext()} {
		ps := processes[i]
		require.Equal(t, trace.SpanKindConsumer, ps.SpanKind())
		require.Equal(t, request.SpanContext().TraceID(), ps.SpanContext().TraceID(), "one trace from the request to the consumer")
		require.Equal(t, parent.SpanID(), ps.Parent().SpanID())
		require.True(t, ps.Parent().IsRemote())
		require.Len(t, ps.Links(), 1)
		require.Equal(t, parent.SpanID(), ps.Links()[0].SpanContext.SpanID())
		require.Equal(t, ps.SpanContext().SpanID(), handled[i].SpanID(), "the handler runs inside the process span")
		attrs := map[string]string{}
		for _, kv := range ps.Attributes() {
			attrs[string(kv.Key)] = kv.Value.Emit()
		}
		require.Equal(t, "kafka", attrs["messaging.system"])
		require.Equal(t, "process", attrs["messaging.operation.type"])
		require.Equal(t, topic, attrs["messaging.destination.name"])
		require.Equal(t, "traced-group", attrs["messaging.consumer.group.name"])
		require.Equal(t, []string{"id-created", "id-published"}[i], attrs["messaging.message.id"])
	}
}

// TestBatchProcessSpanLinksEveryMessage: a batch's process span links the
// creation context of each message in it.
func TestBatchProcessSpanLinksEveryMessage(t *testing.T) {
	const topic = "traced-batch"
	addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	tr, rec := recording(t)
	tracer := NewTracer(tr)
	var msgs []kafka.Message
	var want []trace.SpanID
	for i := range 3 {
		ctx, span := tr.Tracer().Start(context.Background(), "request")
		msgs = append(msgs, kafka.Message{Topic: topic, Key: []byte("k"), Value: []byte{byte('0' + i)},
			Headers: tracer.Create(ctx, topic, "id", nil)})
		span.End()
	}
	publish(t, addr, msgs...)
	for _, s := range rec.Ended() {
		if s.Name() == "create "+topic {
			want = append(want, s.SpanContext().SpanID())
		}
	}
	require.Len(t, want, 3)

	got := make(chan int, 10)
	cfg := fastConsumerConfig(t, addr, topic, "traced-batch-group", prometheus.NewRegistry())
	cfg.Tracing = tr
	c, err := NewBatchConsumer(cfg, BatchConfig{MaxMessages: 3, Linger: 5 * time.Second}, func(ctx context.Context, b *Batch) error {
		got <- len(b.Messages)
		return nil
	})
	require.NoError(t, err)
	stop := runConsumer(t, c)
	select {
	case n := <-got:
		require.Equal(t, 3, n)
	case <-time.After(20 * time.Second):
		t.Fatal("no batch")
	}
	require.NoError(t, stop())
	ps := spanNamed(t, rec, "process "+topic)
	require.Equal(t, trace.SpanKindConsumer, ps.SpanKind())
	var linked []trace.SpanID
	for _, l := range ps.Links() {
		linked = append(linked, l.SpanContext.SpanID())
	}
	require.ElementsMatch(t, want, linked)
}
