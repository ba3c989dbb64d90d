package stream

import (
	"bytes"
	"encoding/json"
	"log/slog"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
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
