package stream

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

func TestOffsetTrackCommitsOnlyContiguousPrefix(t *testing.T) {
	type step struct {
		finish     int64
		wantCommit int64 // -1: nothing to commit
	}
	tests := []struct {
		name  string
		begin []int64
		steps []step
	}{
		{
			name:  "in order",
			begin: []int64{0, 1, 2},
			steps: []step{{0, 0}, {1, 1}, {2, 2}},
		},
		{
			name:  "out of order waits for the gap",
			begin: []int64{10, 11, 12, 13},
			steps: []step{{12, -1}, {13, -1}, {10, 10}, {11, 13}},
		},
		{
			name:  "reverse order",
			begin: []int64{5, 6, 7},
			steps: []step{{7, -1}, {6, -1}, {5, 7}},
		},
		{
			name:  "offset gaps (transaction markers, compaction) are not holes",
			begin: []int64{3, 7, 8, 20},
			steps: []step{{7, -1}, {3, 7}, {20, 7}, {8, 20}},
		},
		{
			name:  "unknown offsets are ignored",
			begin: []int64{1, 2},
			steps: []step{{99, -1}, {0, -1}, {1, 1}, {2, 2}},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			tr := newOffsetTrack()
			for _, o := range tt.begin {
				require.True(t, tr.begin(o))
			}
			for i, s := range tt.steps {
				tr.finish(s.finish)
				off, ok := tr.commitPoint()
				if s.wantCommit < 0 {
					require.False(t, ok, "step %d (finish %d): committed %d", i, s.finish, off)
					continue
				}
				require.True(t, ok, "step %d (finish %d)", i, s.finish)
				require.Equal(t, s.wantCommit, off, "step %d (finish %d)", i, s.finish)
			}
			require.Zero(t, tr.inFlight())
		})
	}
}

func TestOffsetTrackCommittedAndRedelivery(t *testing.T) {
	tr := newOffsetTrack()
	for o := int64(0); o < 4; o++ {
		require.True(t, tr.begin(o))
	}
	tr.finish(0)
	tr.finish(1)
	off, ok := tr.commitPoint()
	require.True(t, ok)
	require.EqualValues(t, 1, off)
	tr.markCommitted(off)
	_, ok = tr.commitPoint()
	require.False(t, ok, "nothing new to commit")

	// After a rebalance kafka-go fetches again from the committed offset:
	// messages already taken are refused, new ones are accepted.
	require.False(t, tr.begin(2), "in flight")
	require.False(t, tr.begin(1), "finished")
	require.True(t, tr.begin(4))
	require.Equal(t, 3, tr.inFlight())

	tr.finish(3)
	tr.finish(4)
	_, ok = tr.commitPoint()
	require.False(t, ok, "2 is still in flight")
	tr.finish(2)
	off, ok = tr.commitPoint()
	require.True(t, ok)
	require.EqualValues(t, 4, off)

	// The backing array is reused after the queue empties.
	for o := int64(5); o < 2000; o++ {
		require.True(t, tr.begin(o))
		tr.finish(o)
	}
	off, _ = tr.commitPoint()
	require.EqualValues(t, 1999, off)
}

type validationError struct{ field string }

func (e *validationError) Error() string   { return "invalid " + e.field }
func (e *validationError) Permanent() bool { return true }

type notPermanent struct{}

func (notPermanent) Error() string   { return "looks permanent, is not" }
func (notPermanent) Permanent() bool { return false }

func TestIsPermanent(t *testing.T) {
	base := errors.New("boom")
	tests := []struct {
		name string
		err  error
		want bool
	}{
		{"nil", nil, false},
		{"plain", base, false},
		{"Permanent", Permanent(base), true},
		{"wrapped Permanent", fmt.Errorf("decode: %w", Permanent(base)), true},
		{"interface", &validationError{"ts"}, true},
		{"wrapped interface", fmt.Errorf("decode: %w", &validationError{"ts"}), true},
		{"joined", errors.Join(base, &validationError{"ip"}), true},
		{"Permanent() false", notPermanent{}, false},
		{"Permanent() false wrapping true", fmt.Errorf("%w: %w", notPermanent{}, Permanent(base)), true},
		{"context error", fmt.Errorf("call: %w", errors.New("deadline")), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.want, IsPermanent(tt.err))
		})
	}
	require.Nil(t, Permanent(nil))
	require.ErrorIs(t, Permanent(base), base, "Permanent keeps errors.Is working")
}

func TestDLQRecordRoundTrip(t *testing.T) {
	orig := time.Date(2026, 3, 1, 12, 30, 45, 123456789, time.FixedZone("x", 3600))
	first := time.Date(2026, 3, 1, 11, 31, 0, 999_000_000, time.UTC)
	rec := DLQRecord{
		Key:   []byte("user:42"),
		Value: []byte{0, 1, 2, 0xff, '{'},
		Headers: []kafka.Header{
			{Key: "ce_id", Value: []byte("e1")},
			{Key: "dlq_error_class", Value: []byte("stale, from an earlier dead-lettering")},
		},
		SourceTopic:   "floodgate.decisions.v1",
		Partition:     7,
		Offset:        123456789012,
		Timestamp:     orig,
		ConsumerGroup: "quota",
		Service:       "quota",
		ErrorClass:    ClassPoison,
		ErrorMessage:  strings.Repeat("é", 600) + "tail", // 1204 bytes: cut at a rune boundary
		Attempts:      1,
		FirstFailure:  first,
	}
	msg := rec.Message("floodgate.decisions.v1.dlq")
	require.Equal(t, "floodgate.decisions.v1.dlq", msg.Topic)
	h := kafkatest.Headers(msg.Headers)
	require.Equal(t, "2026-03-01T11:30:45.123Z", h[HeaderDLQTimestamp])
	require.Equal(t, "2026-03-01T11:31:00.999Z", h[HeaderDLQFirstFailure])
	require.Equal(t, "poison", h[HeaderDLQErrorClass], "old dlq_ headers are replaced")
	require.Len(t, h[HeaderDLQErrorMessage], 1024)

	got, err := ParseDLQRecord(msg)
	require.NoError(t, err)
	require.Equal(t, rec.Key, got.Key)
	require.Equal(t, rec.Value, got.Value)
	require.Equal(t, []kafka.Header{{Key: "ce_id", Value: []byte("e1")}}, got.Headers)
	require.Equal(t, rec.SourceTopic, got.SourceTopic)
	require.Equal(t, rec.Partition, got.Partition)
	require.Equal(t, rec.Offset, got.Offset)
	require.True(t, orig.Truncate(time.Millisecond).Equal(got.Timestamp))
	require.True(t, first.Equal(got.FirstFailure))
	require.Equal(t, ClassPoison, got.ErrorClass)
	require.Equal(t, strings.Repeat("é", 512), got.ErrorMessage)
	require.Equal(t, 1, got.Attempts)
	require.Equal(t, "quota", got.ConsumerGroup)
	require.Equal(t, "quota", got.Service)

	replay := got.Replay()
	require.Equal(t, rec.SourceTopic, replay.Topic)
	require.Equal(t, rec.Value, replay.Value)
	group, ok := replayedFor(replay, rec.SourceTopic)
	require.True(t, ok, "a replay carries its provenance")
	require.Equal(t, "quota", group)
	_, ok = replayedFor(got.Message(rec.SourceTopic+".dlq"), rec.SourceTopic+".dlq")
	require.False(t, ok, "a dead letter read from its DLQ topic is not a replay")
	again, err := ParseDLQRecord(replay)
	require.NoError(t, err, "a replay can be read back as the record it came from")
	require.Equal(t, rec.Offset, again.Offset)
}

func TestParseDLQRecordErrors(t *testing.T) {
	good := DLQRecord{SourceTopic: "t", ErrorClass: ClassHandlerPanic, Attempts: 1}.Message("t.dlq")
	without := func(name string) kafka.Message {
		m := good
		m.Headers = nil
		for _, h := range good.Headers {
			if h.Key != name {
				m.Headers = append(m.Headers, h)
			}
		}
		return m
	}
	with := func(name, value string) kafka.Message {
		m := without(name)
		m.Headers = append(m.Headers, kafka.Header{Key: name, Value: []byte(value)})
		return m
	}
	tests := []struct {
		name    string
		msg     kafka.Message
		wantErr string
	}{
		{"missing offset", without(HeaderDLQOffset), HeaderDLQOffset + " missing"},
		{"missing class", without(HeaderDLQErrorClass), HeaderDLQErrorClass + " missing"},
		{"bad partition", with(HeaderDLQPartition, "x"), HeaderDLQPartition},
		{"bad time", with(HeaderDLQTimestamp, "yesterday"), HeaderDLQTimestamp},
		{"unknown class", with(HeaderDLQErrorClass, "oops"), "unknown class"},
		{"plain message", kafka.Message{Value: []byte("{}")}, HeaderDLQSourceTopic},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := ParseDLQRecord(tt.msg)
			require.ErrorIs(t, err, ErrNotDLQRecord)
			require.ErrorContains(t, err, tt.wantErr)
		})
	}
	_, err := ParseDLQRecord(good)
	require.NoError(t, err)
}

func TestCloudEventHeaders(t *testing.T) {
	ts := time.Date(2026, 1, 2, 3, 4, 5, 6_000_000, time.FixedZone("y", -5*3600))
	hs := CloudEventHeaders("decision.v1", "01J0ID", "floodgate/limiter", ts)
	var keys []string
	for _, h := range hs {
		keys = append(keys, h.Key)
	}
	require.Equal(t, []string{"ce_id", "ce_type", "ce_source", "ce_time", "ce_specversion", "content-type"}, keys)
	require.Equal(t, map[string]string{
		"ce_id": "01J0ID", "ce_type": "decision.v1", "ce_source": "floodgate/limiter",
		"ce_time": "2026-01-02T08:04:05.006Z", "ce_specversion": "1.0", "content-type": "application/json",
	}, kafkatest.Headers(hs))
}

func TestConsumerConfigValidate(t *testing.T) {
	valid := func() ConsumerConfig {
		return ConsumerConfig{
			Brokers: []string{"127.0.0.1:9092"}, Topic: "t", GroupID: "g", Service: "s",
			Logger: slog.New(slog.DiscardHandler), Registerer: prometheus.NewRegistry(),
		}
	}
	tests := []struct {
		name   string
		mutate func(*ConsumerConfig)
		field  string // "" = valid
	}{
		{"valid with defaults", func(*ConsumerConfig) {}, ""},
		{"no brokers", func(c *ConsumerConfig) { c.Brokers = nil }, "Brokers"},
		{"empty broker", func(c *ConsumerConfig) { c.Brokers = []string{""} }, "Brokers"},
		{"no topic", func(c *ConsumerConfig) { c.Topic = "" }, "Topic"},
		{"no group", func(c *ConsumerConfig) { c.GroupID = "" }, "GroupID"},
		{"no service", func(c *ConsumerConfig) { c.Service = "" }, "Service"},
		{"dlq is source", func(c *ConsumerConfig) { c.DLQTopic = "t" }, "DLQTopic"},
		{"negative attempts", func(c *ConsumerConfig) { c.MaxAttempts = -1 }, "MaxAttempts"},
		{"negative drain", func(c *ConsumerConfig) { c.DrainTimeout = -time.Second }, "DrainTimeout"},
		{"max below initial backoff", func(c *ConsumerConfig) {
			c.InitialBackoff, c.MaxBackoff = time.Second, 10*time.Millisecond
		}, "MaxBackoff"},
		{"heartbeat not below session", func(c *ConsumerConfig) {
			c.HeartbeatInterval, c.SessionTimeout = 2*time.Second, time.Second
		}, "HeartbeatInterval"},
		{"heartbeat above a third of the session", func(c *ConsumerConfig) {
			c.HeartbeatInterval, c.SessionTimeout = 3*time.Second, 6*time.Second
		}, "HeartbeatInterval"},
		{"heartbeat above a third of the default session", func(c *ConsumerConfig) { c.HeartbeatInterval = 3 * time.Second }, "HeartbeatInterval"},
		{"rebalance shorter than the session", func(c *ConsumerConfig) { c.RebalanceTimeout = 2 * time.Second }, "RebalanceTimeout"},
		{"bad start offset", func(c *ConsumerConfig) { c.StartOffset = 42 }, "StartOffset"},
		{"no logger", func(c *ConsumerConfig) { c.Logger = nil }, "Logger"},
		{"no registerer", func(c *ConsumerConfig) { c.Registerer = nil }, "Registerer"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			cfg := valid()
			tt.mutate(&cfg)
			err := cfg.Validate()
			if tt.field == "" {
				require.NoError(t, err)
				d := cfg.withDefaults()
				require.Equal(t, "t.dlq", d.DLQTopic)
				require.Equal(t, DefaultMaxAttempts, d.MaxAttempts)
				require.Equal(t, kafka.FirstOffset, d.StartOffset)
				require.Equal(t, time.Second, d.HeartbeatInterval, "group defaults: heartbeat 1s")
				require.Equal(t, 6*time.Second, d.SessionTimeout, "group defaults: session 6s")
				require.Equal(t, 20*time.Second, d.RebalanceTimeout, "group defaults: rebalance 20s")
				c := &Consumer{cfg: d}
				require.Equal(t, DefaultDrainTimeout, c.revokeTimeout(), "a revoked partition gets the whole drain budget")
				return
			}
			require.ErrorIs(t, err, ErrInvalidConfig)
			require.ErrorContains(t, err, "ConsumerConfig."+tt.field+":")
			_, nerr := NewConsumer(cfg, func(context.Context, kafka.Message) error { return nil })
			require.ErrorIs(t, nerr, ErrInvalidConfig)
		})
	}
}

func TestProducerConfigValidate(t *testing.T) {
	require.NoError(t, ProducerConfig{Brokers: []string{"a:1"}}.Validate())
	err := ProducerConfig{BatchSize: -1}.Validate()
	require.ErrorIs(t, err, ErrInvalidConfig)
	require.ErrorContains(t, err, "ProducerConfig.Brokers:")
	require.ErrorContains(t, err, "ProducerConfig.BatchSize:")
	require.ErrorContains(t, ProducerConfig{Brokers: []string{"a:1"}, MetadataTTL: -time.Second}.Validate(), "ProducerConfig.MetadataTTL:")
	p := NewProducer(ProducerConfig{Brokers: []string{"a:1"}, MetadataTTL: time.Second})
	require.Equal(t, time.Second, p.transport.MetadataTTL, "the writer's transport trusts its metadata for MetadataTTL")
	require.NoError(t, p.Close())

	require.NoError(t, AsyncProducerConfig{Brokers: []string{"a:1"}}.Validate())
	err = AsyncProducerConfig{Brokers: []string{"a:1"}, BufferSize: -1, InitialBackoff: time.Minute, MaxBackoff: time.Second}.Validate()
	require.ErrorContains(t, err, "AsyncProducerConfig.BufferSize:")
	require.ErrorContains(t, err, "AsyncProducerConfig.MaxBackoff:")
}

func TestNewMetricsSharesARegistry(t *testing.T) {
	reg := prometheus.NewRegistry()
	m1, err := NewMetrics(reg)
	require.NoError(t, err)
	m2, err := NewMetrics(reg)
	require.NoError(t, err, "a second registration on the same registry reuses the collectors")
	m1.consumed.WithLabelValues("a", "g1", outcomeOK).Inc()
	m2.consumed.WithLabelValues("a", "g2", outcomeOK).Inc()
	require.Equal(t, 2.0, streamtest.MetricValue(t, reg, "floodgate_stream_consumed_total", map[string]string{"topic": "a"}))

	// Two consumers on one registry.
	for _, group := range []string{"g1", "g2"} {
		cfg := ConsumerConfig{
			Brokers: []string{"127.0.0.1:1"}, Topic: "a", GroupID: group, Service: "s",
			Logger: slog.New(slog.DiscardHandler), Registerer: reg,
		}
		_, err := NewConsumer(cfg, func(context.Context, kafka.Message) error { return nil })
		require.NoError(t, err)
	}

	// A conflicting collector under one of the names is an error, not a panic.
	other := prometheus.NewRegistry()
	other.MustRegister(prometheus.NewCounter(prometheus.CounterOpts{Name: "floodgate_stream_dlq_total", Help: "x"}))
	_, err = NewMetrics(other)
	require.Error(t, err)
}
