package stream

import (
	"context"
	"slices"
	"strconv"

	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	semconv "go.opentelemetry.io/otel/semconv/v1.43.0"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// W3C trace context Kafka header names: a message carries the span context
// it was created in beside the CloudEvents headers, as the OpenTelemetry
// messaging conventions and the CloudEvents distributed-tracing extension
// name them.
const (
	HeaderTraceparent = "traceparent"
	HeaderTracestate  = "tracestate"
)

// maxLinks bounds the links of a batch's process span (the SDK keeps 128).
const maxLinks = 128

// HeaderCarrier lets a propagator read and write a message's headers. Set
// replaces a header with the same key; it never writes into the slice it
// was given (a caller's message is not modified), it makes a new one.
type HeaderCarrier struct {
	Headers *[]kafka.Header
}

var _ propagation.TextMapCarrier = HeaderCarrier{}

// Get returns the value of the first header named key, or "".
func (c HeaderCarrier) Get(key string) string { return headerValue(*c.Headers, key) }

func headerValue(hs []kafka.Header, key string) string {
	for _, h := range hs {
		if h.Key == key {
			return string(h.Value)
		}
	}
	return ""
}

// Set sets the header named key to value.
func (c HeaderCarrier) Set(key, value string) {
	hs := *c.Headers
	for i, h := range hs {
		if h.Key == key {
			hs = slices.Clone(hs)
			hs[i].Value = []byte(value)
			*c.Headers = hs
			return
		}
	}
	*c.Headers = append(slices.Clip(hs), kafka.Header{Key: key, Value: []byte(value)})
}

// Keys returns every header's key.
func (c HeaderCarrier) Keys() []string {
	keys := make([]string, len(*c.Headers))
	for i, h := range *c.Headers {
		keys[i] = h.Key
	}
	return keys
}

// InjectTrace returns headers with ctx's span context written into them
// (traceparent, tracestate, and baggage with the default propagator); a
// context without a span leaves them as they are. headers itself is not
// modified.
func InjectTrace(ctx context.Context, prop propagation.TextMapPropagator, headers []kafka.Header) []kafka.Header {
	prop.Inject(ctx, HeaderCarrier{Headers: &headers})
	return headers
}

// ExtractTrace returns ctx with the remote span context msg carries, if any.
func ExtractTrace(ctx context.Context, prop propagation.TextMapPropagator, msg kafka.Message) context.Context {
	return prop.Extract(ctx, HeaderCarrier{Headers: &msg.Headers})
}

// Tracer makes the Kafka spans of the OpenTelemetry messaging conventions.
// A nil *Tracer (NewTracer when tracing is off) makes none and costs nothing.
// Safe for concurrent use.
type Tracer struct {
	tracer trace.Tracer
	prop   propagation.TextMapPropagator
}

// NewTracer returns a Tracer on t, or nil when t is off.
func NewTracer(t tracing.Tracing) *Tracer {
	if !t.Enabled() {
		return nil
	}
	return &Tracer{tracer: t.Tracer(), prop: t.Propagators()}
}

// Create makes the "create <topic>" producer span of one message, a child
// of ctx's span, and returns headers with its context injected: the
// message's creation context, which its consumers continue. It is for
// producers that hand the message on without waiting (AsyncProducer); id is
// the message's id (its ce_id); attrs are added to the span. On a nil
// Tracer it returns headers as they are.
func (t *Tracer) Create(ctx context.Context, topic, id string, headers []kafka.Header, attrs ...attribute.KeyValue) []kafka.Header {
	if t == nil {
		return headers
	}
	ctx, span := t.tracer.Start(ctx, "create "+topic, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(semconv.MessagingSystemKafka, semconv.MessagingOperationTypeCreate,
			semconv.MessagingOperationName("create"), semconv.MessagingDestinationName(topic), semconv.MessagingMessageID(id)),
		trace.WithAttributes(attrs...))
	defer span.End()
	return InjectTrace(ctx, t.prop, headers)
}

// send starts the "send <topic>" producer span of a Publish call and
// returns msgs with its context injected into those that carry none (the
// creation context of theirs; messages that already carry one, e.g. dead
// letters keeping the original's headers, keep it and are linked). msgs is
// copied before any header is set.
func (t *Tracer) send(ctx context.Context, msgs []kafka.Message) (context.Context, trace.Span, []kafka.Message) {
	topic := msgs[0].Topic
	attrs := []attribute.KeyValue{semconv.MessagingSystemKafka, semconv.MessagingOperationTypeSend,
		semconv.MessagingOperationName("send"), semconv.MessagingDestinationName(topic)}
	if len(msgs) > 1 {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(msgs)))
	} else if id := headerValue(msgs[0].Headers, HeaderCEID); id != "" {
		attrs = append(attrs, semconv.MessagingMessageID(id))
	}
	var links []trace.Link
	for _, m := range msgs {
		if sc := trace.SpanContextFromContext(ExtractTrace(context.Background(), t.prop, m)); sc.IsValid() && len(links) < maxLinks {
			links = append(links, trace.Link{SpanContext: sc})
		}
	}
	ctx, span := t.tracer.Start(ctx, "send "+topic, trace.WithSpanKind(trace.SpanKindProducer),
		trace.WithAttributes(attrs...), trace.WithLinks(links...))
	out := slices.Clone(msgs)
	for i := range out {
		if headerValue(out[i].Headers, HeaderTraceparent) == "" {
			out[i].Headers = InjectTrace(ctx, t.prop, out[i].Headers)
		}
	}
	return ctx, span, out
}

// process starts the "process <topic>" consumer span of one handler
// invocation. One message: the span is the child of the message's creation
// context (a decision is one request's), and links to it too. A batch: a new
// trace linking every message's creation context (up to maxLinks).
func (t *Tracer) process(ctx context.Context, inv *Invocation) (context.Context, trace.Span) {
	msgs := inv.Messages
	attrs := []attribute.KeyValue{semconv.MessagingSystemKafka, semconv.MessagingOperationTypeProcess,
		semconv.MessagingOperationName("process"), semconv.MessagingDestinationName(inv.Topic),
		semconv.MessagingConsumerGroupName(inv.Group),
		semconv.MessagingDestinationPartitionID(strconv.Itoa(msgs[0].Partition)),
		attribute.Int(tracing.AttrAttempt, inv.Attempt)}
	var links []trace.Link
	if len(msgs) == 1 {
		m := msgs[0]
		attrs = append(attrs, semconv.MessagingKafkaOffset(int(m.Offset)))
		if id := headerValue(m.Headers, HeaderCEID); id != "" {
			attrs = append(attrs, semconv.MessagingMessageID(id))
		}
		if remote := ExtractTrace(ctx, t.prop, m); trace.SpanContextFromContext(remote).IsValid() {
			ctx = remote
			links = append(links, trace.Link{SpanContext: trace.SpanContextFromContext(remote)})
		}
	} else {
		attrs = append(attrs, semconv.MessagingBatchMessageCount(len(msgs)))
		for _, m := range msgs {
			if len(links) == maxLinks {
				break
			}
			if sc := trace.SpanContextFromContext(ExtractTrace(context.Background(), t.prop, m)); sc.IsValid() {
				links = append(links, trace.Link{SpanContext: sc})
			}
		}
	}
	return t.tracer.Start(ctx, "process "+inv.Topic, trace.WithSpanKind(trace.SpanKindConsumer),
		trace.WithAttributes(attrs...), trace.WithLinks(links...))
}

// endSpan ends span with err's status.
func endSpan(span trace.Span, err error) {
	if err != nil {
		span.RecordError(err)
		span.SetStatus(codes.Error, err.Error())
	}
	span.End()
}
