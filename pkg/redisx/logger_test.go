package redisx

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
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
	require.Equal(t, dial, lines[0]["cause"], "the template: what the rate limit and a reader group by")
	require.Equal(t, "connection pool: failed to dial after 5 attempts: dial tcp 127.0.0.1:6390: connect: connection refused", lines[0]["detail"])
	require.Equal(t, "INFO", lines[1]["level"], "a new master is news, not trouble")
	require.EqualValues(t, 38, lines[2]["lines_not_logged"], "the next line of a cause counts those held back")
}

// The start line names what is configured, never a password (issue 38.2).
func TestOptionsLogValue(t *testing.T) {
	line := func(o Options) string {
		var buf bytes.Buffer
		slog.New(slog.NewJSONHandler(&buf, nil)).Info("limiter serving", "redis", o)
		return buf.String()
	}
	sentinel := line(Options{Addrs: []string{"127.0.0.1:6379"}, SentinelMaster: "fg", SentinelAddrs: []string{"10.0.0.1:26379", "10.0.0.2:26379"},
		Security: config.RedisSecurity{Username: "limiter", Password: "hunter2", SentinelPassword: "s3cret", TLS: &tls.Config{}}})
	require.Contains(t, sentinel, `"redis":{"mode":"sentinel","sentinel_master":"fg","sentinels":["10.0.0.1:26379","10.0.0.2:26379"],"tls":true,"user":"limiter","password":true,"sentinel_password":true}`)
	require.NotContains(t, sentinel, "hunter2")
	require.NotContains(t, sentinel, "s3cret")
	require.NotContains(t, sentinel, "127.0.0.1:6379", "not the unused FLOODGATE_REDIS_ADDRS")
	require.Contains(t, line(Options{Addrs: []string{"a:1", "b:2"}}), `"redis":{"mode":"cluster","seeds":["a:1","b:2"],"tls":false,"password":false}`)
	require.Contains(t, line(Options{Addrs: []string{"a:1"}}), `"redis":{"mode":"standalone","addr":"a:1","tls":false,"password":false}`)
}
