package stream

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

// bigBroker is a broker that accepts produce batches of up to 64 MiB, so a
// test can write the oversize messages an attacker would.
func bigBroker(t *testing.T, topic string) string {
	_, addr := kafkatest.StartCluster(t, map[string]int32{topic: 1, topic + ".dlq": 1},
		kfake.BrokerConfigs(map[string]string{"message.max.bytes": strconv.Itoa(64 << 20)}))
	return addr
}

func rawWriter(addr string, compression kafka.Compression) *kafka.Writer {
	return &kafka.Writer{Addr: kafka.TCP(addr), RequiredAcks: kafka.RequireAll, BatchTimeout: time.Millisecond,
		BatchBytes: 128 << 20, Compression: compression}
}

// TestDoorOversizeMessageIsDeadLetteredAsReference: a 5 MB message never
// reaches the handler; it is dead-lettered as a reference (topic, partition,
// offset, size, SHA-256, reason; no value) and the partition moves on within
// 5 s.
func TestDoorOversizeMessageIsDeadLetteredAsReference(t *testing.T) {
	const topic, group = "door-big", "g-door-big"
	addr := bigBroker(t, topic)
	var got collector
	reg := prometheus.NewRegistry()
	c, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, reg), got.handle)
	require.NoError(t, err)
	stop := runConsumer(t, c)
	publish(t, addr, kafka.Message{Topic: topic, Key: []byte("k"), Value: []byte("before")})
	require.Eventually(t, func() bool { return got.has("before") }, waitFor, 10*time.Millisecond)

	big := bytes.Repeat([]byte("x"), 5<<20)
	w := rawWriter(addr, 0)
	defer w.Close()
	start := time.Now()
	require.NoError(t, w.WriteMessages(context.Background(),
		kafka.Message{Topic: topic, Key: []byte("attacker"), Value: big, Headers: []kafka.Header{{Key: "ce_type", Value: []byte("decision.v1")}}},
		kafka.Message{Topic: topic, Key: []byte("k"), Value: []byte("after")}))
	require.Eventually(t, func() bool { return got.has("after") }, 5*time.Second, 10*time.Millisecond,
		"the partition moves on within 5 s")
	t.Logf("the message after a 5 MB one was handled %v after both were produced", time.Since(start).Round(time.Millisecond))
	require.NoError(t, stop())

	require.Equal(t, []string{"before", "after"}, got.values(), "the oversize message never reached the handler")
	dl := kafkatest.ReadPartition(t, addr, topic+".dlq", 0, 1)[0]
	require.Less(t, messageBytes(dl), 4096, "the dead letter is a small reference")
	rec, err := ParseDLQRecord(dl)
	require.NoError(t, err)
	sum := sha256.Sum256(big)
	require.True(t, rec.Reference)
	require.Equal(t, ClassOversize, rec.ErrorClass)
	require.Equal(t, topic, rec.SourceTopic)
	require.Equal(t, 0, rec.Partition)
	require.EqualValues(t, 1, rec.Offset)
	require.EqualValues(t, len(big)+len("attacker")+len("ce_type")+len("decision.v1"), rec.OriginalSize)
	require.Equal(t, hex.EncodeToString(sum[:]), rec.OriginalSHA256)
	require.Empty(t, rec.Value)
	require.Equal(t, "attacker", string(rec.Key))
	require.Contains(t, rec.ErrorMessage, "over the limit")
	require.Equal(t, []int64{3}, kafkatest.CommittedOffsets(t, addr, group, topic, 1))
	require.Equal(t, 1.0, streamtest.MetricValue(t, reg, "floodgate_stream_dlq_total", map[string]string{"class": "oversize"}))
}

// TestDoorGzipBombIsRefusedUndecompressed: a gzip batch that inflates to
// 48 MiB (under 100 KB on the wire) is never decompressed past the limit: its
// offsets are dead-lettered as one reference naming the decompression bound,
// and the partition moves on within 5 s.
func TestDoorGzipBombIsRefusedUndecompressed(t *testing.T) {
	const topic, group = "door-bomb", "g-door-bomb"
	addr := bigBroker(t, topic)
	var got collector
	reg := prometheus.NewRegistry()
	cfg := fastConsumerConfig(t, addr, topic, group, reg)
	cfg.MaxDecompressedBytes = 4 << 20
	c, err := NewConsumer(cfg, got.handle)
	require.NoError(t, err)
	stop := runConsumer(t, c)
	publish(t, addr, kafka.Message{Topic: topic, Value: []byte("before")})
	require.Eventually(t, func() bool { return got.has("before") }, waitFor, 10*time.Millisecond)

	gz := rawWriter(addr, kafka.Gzip)
	defer gz.Close()
	var bomb []kafka.Message
	for range 48 {
		bomb = append(bomb, kafka.Message{Topic: topic, Value: make([]byte, 1<<20)})
	}
	require.NoError(t, gz.WriteMessages(context.Background(), bomb...))
	start := time.Now()
	publish(t, addr, kafka.Message{Topic: topic, Value: []byte("after")})
	require.Eventually(t, func() bool { return got.has("after") }, 5*time.Second, 10*time.Millisecond,
		"the partition moves on within 5 s")
	t.Logf("the message after a 48 MiB gzip bomb was handled %v after it was produced", time.Since(start).Round(time.Millisecond))
	require.NoError(t, stop())

	require.Equal(t, []string{"before", "after"}, got.values())
	dl := kafkatest.ReadPartition(t, addr, topic+".dlq", 0, 1)[0]
	rec, err := ParseDLQRecord(dl)
	require.NoError(t, err)
	require.True(t, rec.Reference)
	require.Equal(t, ClassOversize, rec.ErrorClass)
	require.EqualValues(t, 1, rec.Offset, "the batch's first offset")
	require.Contains(t, rec.ErrorMessage, "offsets 1..48 decompresses to more than 4194304 bytes")
	require.EqualValues(t, 4<<20, rec.OriginalSize, "the bound it exceeded")
	require.Empty(t, rec.Value)
	require.Equal(t, []int64{50}, kafkatest.CommittedOffsets(t, addr, group, topic, 1), "committed past the bomb")
}

// TestDoorEventTimeWindow: events dated far in the future or older than the
// maximum age go to the DLQ with the reason and never reach the handler.
func TestDoorEventTimeWindow(t *testing.T) {
	const topic, group = "door-time", "g-door-time"
	addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	at := func(v string, ts time.Time) kafka.Message {
		return kafka.Message{Topic: topic, Value: []byte(v), Headers: CloudEventHeaders("decision.v1", v, "test", ts)}
	}
	publish(t, addr,
		at("now", now),
		at("2160", time.Date(2160, 1, 1, 0, 0, 0, 0, time.UTC)),
		at("skewed-ok", now.Add(time.Minute)),
		at("skewed-bad", now.Add(3*time.Minute)),
		at("old", now.Add(-16*24*time.Hour)),
		kafka.Message{Topic: topic, Value: []byte("no-time")},
		at("last", now.Add(-time.Hour)),
	)
	var got collector
	reg := prometheus.NewRegistry()
	cfg := fastConsumerConfig(t, addr, topic, group, reg)
	cfg.Now = func() time.Time { return now }
	cfg.EventTime = func(m kafka.Message) (time.Time, error) {
		for _, h := range m.Headers {
			if h.Key == "ce_time" {
				return time.Parse(TimeFormat, string(h.Value))
			}
		}
		return time.Time{}, Permanent(errMissingTime)
	}
	c, err := NewConsumer(cfg, got.handle)
	require.NoError(t, err)
	stop := runConsumer(t, c)
	require.Eventually(t, func() bool { return got.has("last") }, waitFor, 10*time.Millisecond)
	require.NoError(t, stop())
	require.Equal(t, []string{"now", "skewed-ok", "last"}, got.values())

	want := map[int64]struct {
		class  ErrorClass
		reason string
	}{
		1: {ClassEventTime, "more than 2m0s in the future"},
		3: {ClassEventTime, "more than 2m0s in the future"},
		4: {ClassEventTime, "older than 360h0m0s"},
		5: {ClassPoison, "read event time"},
	}
	for _, dl := range kafkatest.ReadPartition(t, addr, topic+".dlq", 0, len(want)) {
		rec, err := ParseDLQRecord(dl)
		require.NoError(t, err)
		w, ok := want[rec.Offset]
		require.True(t, ok, "offset %d dead-lettered", rec.Offset)
		require.Equal(t, w.class, rec.ErrorClass, "offset %d", rec.Offset)
		require.Contains(t, rec.ErrorMessage, w.reason, "offset %d", rec.Offset)
		require.False(t, rec.Reference, "small messages are dead-lettered whole")
	}
	require.Equal(t, 3.0, streamtest.MetricValue(t, reg, "floodgate_stream_dlq_total", map[string]string{"class": "event_time"}))
}

var errMissingTime = errorString("no ce_time header")

type errorString string

func (e errorString) Error() string { return string(e) }

// TestLagCountsAStuckPartition: a partition whose handler is stuck shows the
// messages waiting behind it, not the lag of the last message finished.
func TestLagCountsAStuckPartition(t *testing.T) {
	const topic, group = "stuck", "g-stuck"
	addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	reg := prometheus.NewRegistry()
	release := make(chan struct{})
	c, err := NewConsumer(fastConsumerConfig(t, addr, topic, group, reg), func(ctx context.Context, m kafka.Message) error {
		if string(m.Value) == "stuck" {
			select {
			case <-release:
			case <-ctx.Done():
			}
		}
		return nil
	})
	require.NoError(t, err)
	stop := runConsumer(t, c)
	publish(t, addr, kafka.Message{Topic: topic, Value: []byte("ok")}, kafka.Message{Topic: topic, Value: []byte("stuck")})
	for i := range 10 {
		publish(t, addr, kafka.Message{Topic: topic, Value: []byte("waiting-" + strconv.Itoa(i))})
	}
	lagOf := func() float64 {
		return streamtest.MetricValue(t, reg, "floodgate_stream_partition_lag", map[string]string{"topic": topic, "partition": "0"})
	}
	require.Eventually(t, func() bool { return lagOf() == 11 }, waitFor, 20*time.Millisecond,
		"the stuck message and the 10 behind it; last seen %v", lagOf())
	require.Equal(t, 11.0, streamtest.MetricValue(t, reg, "floodgate_stream_lag", map[string]string{"topic": topic}))
	close(release)
	require.Eventually(t, func() bool { return lagOf() == 0 }, waitFor, 20*time.Millisecond)
	require.NoError(t, stop())
}

func TestEventTimeWindowCheck(t *testing.T) {
	now := time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	w := EventTimeWindow{MaxFuture: time.Minute, MaxAge: time.Hour, Now: func() time.Time { return now }}
	tests := []struct {
		name   string
		t      time.Time
		reason string
	}{
		{"now", now, ""},
		{"at the future edge", now.Add(time.Minute), ""},
		{"past the future edge", now.Add(time.Minute + time.Millisecond), "in the future"},
		{"year 2160", time.Date(2160, 1, 1, 0, 0, 0, 0, time.UTC), "in the future"},
		{"at the age edge", now.Add(-time.Hour), ""},
		{"too old", now.Add(-time.Hour - time.Millisecond), "older than"},
		{"zero time", time.Time{}, "older than"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := w.Check(tt.t)
			if tt.reason == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorContains(t, err, tt.reason)
			require.True(t, IsPermanent(err))
			require.Equal(t, ClassEventTime, classify(err))
		})
	}
}

func TestReferenceRoundTrip(t *testing.T) {
	rec := DLQRecord{Key: []byte(strings.Repeat("k", 1000)), Value: []byte("value"), Headers: []kafka.Header{{Key: "h", Value: []byte("v")}},
		SourceTopic: "t", Partition: 2, Offset: 9, Timestamp: time.UnixMilli(1000).UTC(), ConsumerGroup: "g", Service: "s",
		ErrorClass: ClassOversize, ErrorMessage: "too big", Attempts: 0, FirstFailure: time.UnixMilli(2000).UTC()}
	ref := rec.asReference()
	got, err := ParseDLQRecord(ref.Message("t.dlq"))
	require.NoError(t, err)
	sum := sha256.Sum256([]byte("value"))
	require.True(t, got.Reference)
	require.EqualValues(t, 1000+5+2, got.OriginalSize)
	require.Equal(t, hex.EncodeToString(sum[:]), got.OriginalSHA256)
	require.Len(t, got.Key, referenceKeyBytes)
	require.Empty(t, got.Value)
	require.Empty(t, got.Headers)

	plain, err := ParseDLQRecord(rec.Message("t.dlq"))
	require.NoError(t, err)
	require.False(t, plain.Reference)
}

// TestDeadLetterTooLargeToWriteWholeBecomesAReference: a message under the
// limit whose dead letter (its dlq_* headers added) is over it is written as
// a reference with the handler's reason, so the DLQ's own consumers never
// meet a record over the limit.
func TestDeadLetterTooLargeToWriteWholeBecomesAReference(t *testing.T) {
	const topic, group = "dl-big", "g-dl-big"
	addr := kafkatest.Start(t, map[string]int32{topic: 1, topic + ".dlq": 1})
	value := bytes.Repeat([]byte("v"), 2000)
	publish(t, addr, kafka.Message{Topic: topic, Key: []byte("k"), Value: value}, kafka.Message{Topic: topic, Value: []byte("small")})
	cfg := fastConsumerConfig(t, addr, topic, group, prometheus.NewRegistry())
	cfg.MaxMessageBytes = 2048
	c, err := NewConsumer(cfg, func(_ context.Context, m kafka.Message) error {
		return Permanent(errorString("schema violation"))
	})
	require.NoError(t, err)
	stop := runConsumer(t, c)
	dls := kafkatest.ReadPartition(t, addr, topic+".dlq", 0, 2)
	require.NoError(t, stop())
	big, err := ParseDLQRecord(dls[0])
	require.NoError(t, err)
	require.True(t, big.Reference, "2,000 bytes plus the dlq_* headers is over 2,048")
	require.Equal(t, ClassPoison, big.ErrorClass)
	require.Equal(t, "schema violation", big.ErrorMessage)
	require.EqualValues(t, 2001, big.OriginalSize)
	require.LessOrEqual(t, messageBytes(dls[0]), 2048)
	small, err := ParseDLQRecord(dls[1])
	require.NoError(t, err)
	require.False(t, small.Reference)
	require.Equal(t, "small", string(small.Value))
}

// jsonLines decodes each line of a JSON log.
func jsonLines(t *testing.T, log *stacktest.Log) []map[string]any {
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(log.String()), "\n") {
		if l == "" {
			continue
		}
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(l), &m))
		out = append(out, m)
	}
	return out
}

// TestDeadLetterLogAggregates: 1,000 poison messages of one class in an
// interval give two lines (the first with its details, then one summary with
// the count); another class is logged on its own.
func TestDeadLetterLogAggregates(t *testing.T) {
	var buf stacktest.Log
	l := newDeadLetterLog(slog.New(slog.NewJSONHandler(&buf, nil)).With("topic", "floodgate.decisions.v1"), time.Hour)
	for i := 0; i < 1000; i++ {
		l.record(i%12, int64(i), "floodgate.decisions.v1.dlq", ErrorClass("decode"), 1, "route: bad")
	}
	l.record(3, 5000, "floodgate.decisions.v1.dlq", ErrorClass("handler"), 5, "boom")
	require.Len(t, jsonLines(t, &buf), 2, "only the first of each class is logged before the interval ends")
	l.close()
	lines := jsonLines(t, &buf)
	require.Len(t, lines, 3)
	sum := lines[2]
	require.Equal(t, "messages dead-lettered", sum["msg"])
	require.Equal(t, "floodgate.decisions.v1", sum["topic"], "one line per class and source topic")
	require.Equal(t, "decode", sum["class"])
	require.EqualValues(t, 1000, sum["count"])
	require.EqualValues(t, 0, sum["first_offset"])
	require.Equal(t, "route: bad", sum["first_err"])
}

// TestDeadLetterLogIntervalEnds: the summary comes by itself when the
// interval ends, and the next dead letter starts a new interval.
func TestDeadLetterLogIntervalEnds(t *testing.T) {
	var buf stacktest.Log
	l := newDeadLetterLog(slog.New(slog.NewJSONHandler(&buf, nil)), 50*time.Millisecond)
	defer l.close()
	for i := 0; i < 5; i++ {
		l.record(0, int64(i), "t.dlq", ErrorClass("decode"), 1, "bad")
	}
	require.Eventually(t, func() bool { return len(jsonLines(t, &buf)) == 2 }, 5*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 5, jsonLines(t, &buf)[1]["count"])
	l.record(0, 9, "t.dlq", ErrorClass("decode"), 1, "bad")
	require.Len(t, jsonLines(t, &buf), 3)
	require.Equal(t, "message dead-lettered", jsonLines(t, &buf)[2]["msg"])
}

// TestConsumerDeadLetterLogAggregates: 200 poison messages through a real
// consumer, per-message and batch mode alike, log one line at once and one
// summary with count 200 — not 200 lines — while the metric counts each.
func TestConsumerDeadLetterLogAggregates(t *testing.T) {
	for _, batch := range []bool{false, true} {
		t.Run(map[bool]string{false: "per message", true: "batch"}[batch], func(t *testing.T) {
			topic := map[bool]string{false: "dlqlog-msg", true: "dlqlog-batch"}[batch]
			addr := kafkatest.Start(t, map[string]int32{topic: 2, topic + ".dlq": 1})
			var msgs []kafka.Message
			for i := range 200 {
				msgs = append(msgs, kafka.Message{Topic: topic, Key: []byte(strconv.Itoa(i)), Value: []byte("{broken")})
			}
			publish(t, addr, msgs...)
			var buf stacktest.Log
			reg := prometheus.NewRegistry()
			cfg := fastConsumerConfig(t, addr, topic, "g-"+topic, reg)
			cfg.Logger = slog.New(slog.NewJSONHandler(&buf, &slog.HandlerOptions{Level: slog.LevelWarn}))
			cfg.DeadLetterLogInterval = time.Hour
			bad := Permanent(errors.New("decode: unexpected end of JSON"))
			var c *Consumer
			var err error
			if batch {
				c, err = NewBatchConsumer(cfg, BatchConfig{MaxMessages: 30, Linger: 50 * time.Millisecond}, func(_ context.Context, b *Batch) error {
					for i := range b.Messages {
						b.Reject(i, bad)
					}
					return nil
				})
			} else {
				c, err = NewConsumer(cfg, func(context.Context, kafka.Message) error { return bad })
			}
			require.NoError(t, err)
			stop := runConsumer(t, c)
			require.Eventually(t, func() bool {
				return streamtest.MetricValue(t, reg, "floodgate_stream_dlq_total", map[string]string{"class": "poison"}) == 200
			}, waitFor, 10*time.Millisecond)
			require.NoError(t, stop()) // the summary is logged when the consumer stops, or when the interval ends
			var first, summaries []map[string]any
			for _, l := range jsonLines(t, &buf) {
				switch l["msg"] {
				case "message dead-lettered":
					first = append(first, l)
				case "messages dead-lettered":
					summaries = append(summaries, l)
				}
			}
			require.Len(t, first, 1)
			require.Len(t, summaries, 1)
			require.EqualValues(t, 200, summaries[0]["count"])
			require.Equal(t, topic, summaries[0]["topic"])
			require.Equal(t, "poison", summaries[0]["class"])
			require.Equal(t, "decode: unexpected end of JSON", summaries[0]["first_err"])
		})
	}
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
