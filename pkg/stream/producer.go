package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate-dev/floodgate/pkg/tracing"
)

// Producer defaults.
const (
	DefaultProducerBatchTimeout = 5 * time.Millisecond
	DefaultProducerBatchSize    = 100
	DefaultProducerMaxAttempts  = 10
	DefaultProducerWriteTimeout = 10 * time.Second
)

// ErrNoTopic is returned by Publish for a message with no topic when the
// producer has no default topic either.
var ErrNoTopic = errors.New("message has no topic and the producer has no default topic")

// ProducerConfig configures a Producer.
type ProducerConfig struct {
	// Brokers are the bootstrap broker addresses (host:port). Required.
	Brokers []string
	// Topic is the default topic for messages whose Topic is empty. A
	// message's own Topic always wins, so one producer can write to many
	// topics. Optional.
	Topic string
	// Balancer picks a message's partition; default &kafka.Hash{} on the key,
	// so one principal's messages stay on one partition. (kafka.Murmur2Balancer
	// is the choice to agree with Java producers' partitioning.)
	Balancer kafka.Balancer
	// BatchTimeout is how long a partial batch waits for more messages before
	// it is sent; default 5ms (kafka-go's own default is 1s).
	BatchTimeout time.Duration
	// BatchSize is the most messages in one produce batch per partition;
	// default 100.
	BatchSize int
	// MaxAttempts is how many times kafka-go tries a batch before Publish
	// fails; default 10.
	MaxAttempts int
	// WriteTimeout bounds one produce request; default 10s.
	WriteTimeout time.Duration
	// MetadataTTL is how long the connection's cached cluster metadata
	// (partition leaders) is trusted; kafka-go refreshes it at a random time
	// within it (default 6s) and not on a NOT_LEADER error, so a write to a
	// moved leader fails until then. Lower it where writes must follow a
	// leader change quickly (the deferral edge uses 1s).
	MetadataTTL time.Duration
	// Compression codec for batches; default none.
	Compression kafka.Compression
	// Security is the TLS and SASL of the connections (NewSecurity); nil
	// is plaintext without authentication.
	Security *Security

	// Tracing, when on, makes every Publish a "send <topic>" producer span
	// whose context goes out in the traceparent header of each message that
	// carries none. Off (the zero value) costs nothing.
	Tracing tracing.Tracing

	// Logger receives kafka-go's error log at debug level (Publish returns
	// the errors that matter). Nil discards it.
	Logger *slog.Logger
	// Registerer gets the floodgate_stream_* metrics (see NewMetrics). Nil
	// leaves them unregistered.
	Registerer prometheus.Registerer
}

// Validate checks the configuration; zero values that have defaults are valid.
func (c ProducerConfig) Validate() error {
	v := configCheck{config: "ProducerConfig"}
	v.brokers(c.Brokers)
	if c.BatchTimeout < 0 {
		v.bad("BatchTimeout", "must not be negative, got %v", c.BatchTimeout)
	}
	if c.BatchSize < 0 {
		v.bad("BatchSize", "must not be negative, got %d", c.BatchSize)
	}
	if c.MaxAttempts < 0 {
		v.bad("MaxAttempts", "must not be negative, got %d", c.MaxAttempts)
	}
	if c.WriteTimeout < 0 {
		v.bad("WriteTimeout", "must not be negative, got %v", c.WriteTimeout)
	}
	if c.MetadataTTL < 0 {
		v.bad("MetadataTTL", "must not be negative, got %v", c.MetadataTTL)
	}
	return v.err()
}

func (c ProducerConfig) withDefaults() ProducerConfig {
	if c.Balancer == nil {
		c.Balancer = &kafka.Hash{}
	}
	c.BatchTimeout = cmp.Or(c.BatchTimeout, DefaultProducerBatchTimeout)
	c.BatchSize = cmp.Or(c.BatchSize, DefaultProducerBatchSize)
	c.MaxAttempts = cmp.Or(c.MaxAttempts, DefaultProducerMaxAttempts)
	c.WriteTimeout = cmp.Or(c.WriteTimeout, DefaultProducerWriteTimeout)
	c.Logger = OrDiscard(c.Logger)
	return c
}

// Producer writes messages reliably: every Publish waits until all in-sync
// replicas have the messages (acks=all). Safe for concurrent use; concurrent
// Publish calls are batched together.
type Producer struct {
	cfg       ProducerConfig
	w         *kafka.Writer
	transport *kafka.Transport
	metrics   *Metrics
	tracer    *Tracer // nil: no spans
}

// NewProducer creates a Producer; it connects lazily on the first Publish.
// Call cfg.Validate first: NewProducer does not fail, and a producer without
// brokers fails every Publish. If the metrics cannot be registered on
// cfg.Registerer, they are logged and left unregistered.
func NewProducer(cfg ProducerConfig) *Producer {
	cfg = cfg.withDefaults()
	metrics := producerMetrics(cfg.Registerer, cfg.Logger)
	p := newProducer(cfg, metrics)
	p.tracer = NewTracer(cfg.Tracing)
	return p
}

func newProducer(cfg ProducerConfig, metrics *Metrics) *Producer {
	transport := cfg.Security.Transport()
	transport.MetadataTTL = cfg.MetadataTTL // 0: kafka-go's 6s
	w := &kafka.Writer{
		// Topic stays empty: kafka-go refuses a message that names a topic
		// when the writer does too, so Publish sets the default per message.
		Balancer:               cfg.Balancer,
		MaxAttempts:            cfg.MaxAttempts,
		BatchSize:              cfg.BatchSize,
		BatchBytes:             1 << 20,
		BatchTimeout:           cfg.BatchTimeout,
		WriteTimeout:           cfg.WriteTimeout,
		RequiredAcks:           kafka.RequireAll,
		Compression:            cfg.Compression,
		ErrorLogger:            kafkaLogger(cfg.Logger, slog.LevelDebug, "kafka writer"),
		Transport:              transport,
		AllowAutoTopicCreation: false,
	}
	if len(cfg.Brokers) > 0 {
		w.Addr = kafka.TCP(cfg.Brokers...)
	}
	return &Producer{cfg: cfg, w: w, transport: transport, metrics: metrics}
}

// Publish writes msgs and returns once all of them are acknowledged by all
// in-sync replicas, or with an error. Messages without a Topic go to the
// producer's default topic; msgs itself is not modified. On error some of the
// messages may have been written (the error is a kafka.WriteErrors giving each
// message's outcome, when kafka-go knows it); after ctx is cancelled, the
// messages already handed to the writer may still be written.
func (p *Producer) Publish(ctx context.Context, msgs ...kafka.Message) (err error) {
	if len(msgs) == 0 {
		return nil
	}
	for i := range msgs {
		if msgs[i].Topic == "" {
			cp := make([]kafka.Message, len(msgs))
			copy(cp, msgs)
			if err := p.fillTopic(cp); err != nil {
				return fmt.Errorf("publish: %w", err)
			}
			msgs = cp
			break
		}
	}
	if p.tracer != nil {
		var span trace.Span
		ctx, span, msgs = p.tracer.send(ctx, msgs)
		defer func() { endSpan(span, err) }()
	}
	return p.write(ctx, msgs)
}

// fillTopic sets the default topic on messages that have none, in place.
func (p *Producer) fillTopic(msgs []kafka.Message) error {
	for i := range msgs {
		if msgs[i].Topic == "" {
			if p.cfg.Topic == "" {
				return fmt.Errorf("message %d: %w", i, ErrNoTopic)
			}
			msgs[i].Topic = p.cfg.Topic
		}
	}
	return nil
}

// write writes msgs, which all name their topic, and counts the outcome.
func (p *Producer) write(ctx context.Context, msgs []kafka.Message) error {
	err := p.w.WriteMessages(ctx, msgs...)
	p.count(msgs, err)
	if err != nil {
		return fmt.Errorf("publish %d messages: %w", len(msgs), err)
	}
	return nil
}

func (p *Producer) count(msgs []kafka.Message, err error) {
	var werrs kafka.WriteErrors
	perMessage := errors.As(err, &werrs) && len(werrs) == len(msgs)
	// Most batches go to one topic: count runs of a topic with one lookup.
	for i := 0; i < len(msgs); {
		topic := msgs[i].Topic
		var ok, failed int
		for ; i < len(msgs) && msgs[i].Topic == topic; i++ {
			if err == nil || (perMessage && werrs[i] == nil) {
				ok++
			} else {
				failed++
			}
		}
		if ok > 0 {
			p.metrics.produced.WithLabelValues(topic, outcomeOK).Add(float64(ok))
		}
		if failed > 0 {
			p.metrics.produced.WithLabelValues(topic, outcomeError).Add(float64(failed))
		}
	}
}

// Close flushes pending batches, waits for them, and releases connections.
func (p *Producer) Close() error {
	err := p.w.Close()
	p.transport.CloseIdleConnections()
	if err != nil {
		return fmt.Errorf("close producer: %w", err)
	}
	return nil
}

// kafkaLogger adapts slog to kafka-go's Logger at one level.
func kafkaLogger(l *slog.Logger, level slog.Level, component string) kafka.Logger {
	return kafka.LoggerFunc(func(format string, args ...any) {
		if !l.Enabled(context.Background(), level) {
			return
		}
		l.Log(context.Background(), level, component, "detail", fmt.Sprintf(format, args...))
	})
}
