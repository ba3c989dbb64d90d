package redisx

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestLoggerOneLinePerCausePerInterval(t *testing.T) {
	var buf bytes.Buffer
	now := time.Unix(0, 0)
	l := NewLogger(slog.New(slog.NewJSONHandler(&buf, nil)), 10*time.Second, func() time.Time { return now })
	ctx := context.Background()
	dial := "redis: connection pool: failed to dial after %d attempts: %v"
	refused := errors.New("dial tcp 127.0.0.1:6390: connect: connection refused")

	for range 39 { // ≈ what a dead master cost in 2.2 s (issue 38)
		l.Printf(ctx, dial, 5, refused)
		now = now.Add(56 * time.Millisecond)
	}
	l.Printf(ctx, "sentinel: new master=%q addr=%q", "fg", "127.0.0.1:6391")
	now = now.Add(10 * time.Second)
	l.Printf(ctx, dial, 5, refused)

	var lines []map[string]any
	for _, s := range strings.Split(strings.TrimSpace(buf.String()), "\n") {
		var m map[string]any
		require.NoError(t, json.Unmarshal([]byte(s), &m), s)
		lines = append(lines, m)
	}
	require.Len(t, lines, 3)
	require.Equal(t, "WARN", lines[0]["level"])
	require.Equal(t, "go-redis", lines[0]["source"])
	require.Equal(t, "connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:6390: connect: connection refused", lines[0]["detail"])
	require.Equal(t, "INFO", lines[1]["level"], "a new master is news, not trouble")
	require.EqualValues(t, 38, lines[2]["lines_not_logged"], "the next line of a cause counts those held back")
}
