package stream

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) lines(t *testing.T) []map[string]any {
	s.mu.Lock()
	defer s.mu.Unlock()
	var out []map[string]any
	for _, l := range strings.Split(strings.TrimSpace(s.b.String()), "\n") {
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
	var buf syncBuffer
	l := newDeadLetterLog(slog.New(slog.NewJSONHandler(&buf, nil)).With("topic", "floodgate.decisions.v1"), time.Hour)
	for i := 0; i < 1000; i++ {
		l.record(i%12, int64(i), "floodgate.decisions.v1.dlq", ErrorClass("decode"), 1, "route: bad")
	}
	l.record(3, 5000, "floodgate.decisions.v1.dlq", ErrorClass("handler"), 5, "boom")
	require.Len(t, buf.lines(t), 2, "only the first of each class is logged before the interval ends")
	l.close()
	lines := buf.lines(t)
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
	var buf syncBuffer
	l := newDeadLetterLog(slog.New(slog.NewJSONHandler(&buf, nil)), 50*time.Millisecond)
	defer l.close()
	for i := 0; i < 5; i++ {
		l.record(0, int64(i), "t.dlq", ErrorClass("decode"), 1, "bad")
	}
	require.Eventually(t, func() bool { return len(buf.lines(t)) == 2 }, 5*time.Second, 10*time.Millisecond)
	require.EqualValues(t, 5, buf.lines(t)[1]["count"])
	l.record(0, 9, "t.dlq", ErrorClass("decode"), 1, "bad")
	require.Len(t, buf.lines(t), 3)
	require.Equal(t, "message dead-lettered", buf.lines(t)[2]["msg"])
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
			var buf syncBuffer
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
			for _, l := range buf.lines(t) {
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
