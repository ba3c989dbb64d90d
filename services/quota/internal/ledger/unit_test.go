package ledger_test

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
)

func TestConfigUsageTokensBeyondLoopback(t *testing.T) {
	t.Parallel()
	env := map[string]string{"FLOODGATE_QUOTA_ADDR": "0.0.0.0:8085", "FLOODGATE_QUOTA_TOKENS": "console:reader:" + strings.Repeat("ab", 32)}
	cfg, err := ledger.ConfigFromEnv(func(k string) string { return env[k] })
	require.NoError(t, err)
	require.Equal(t, env["FLOODGATE_QUOTA_TOKENS"], cfg.Tokens.Reveal())
}

func TestConfigFromEnv(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{"defaults are valid", map[string]string{}, ""},
		{"usage API beyond loopback without tokens", map[string]string{"FLOODGATE_QUOTA_ADDR": "0.0.0.0:8085"}, "FLOODGATE_QUOTA_TOKENS"},
		{"flush interval too short", map[string]string{"FLOODGATE_QUOTA_FLUSH_INTERVAL": "1ms"}, "FLOODGATE_QUOTA_FLUSH_INTERVAL"},
		{"flush interval malformed", map[string]string{"FLOODGATE_QUOTA_FLUSH_INTERVAL": "soon"}, "FLOODGATE_QUOTA_FLUSH_INTERVAL"},
		{"retention out of range", map[string]string{"FLOODGATE_QUOTA_RETENTION_DAYS": "0"}, "FLOODGATE_QUOTA_RETENTION_DAYS"},
		{"heartbeat not below session", map[string]string{"FLOODGATE_QUOTA_SESSION_TIMEOUT": "1s", "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL": "1s"}, "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL"},
		{"no concurrency", map[string]string{"FLOODGATE_QUOTA_WRITE_CONCURRENCY": "0"}, "FLOODGATE_QUOTA_WRITE_CONCURRENCY"},
		{"heartbeat above a third of the session", map[string]string{"FLOODGATE_QUOTA_SESSION_TIMEOUT": "3s", "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL": "1500ms"}, "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL"},
		{"rebalance below session", map[string]string{"FLOODGATE_QUOTA_REBALANCE_TIMEOUT": "2s"}, "FLOODGATE_QUOTA_REBALANCE_TIMEOUT"},
		{"no future skew", map[string]string{"FLOODGATE_EVENT_MAX_FUTURE": "0s"}, "FLOODGATE_EVENT_MAX_FUTURE"},
		{"max age malformed", map[string]string{"FLOODGATE_EVENT_MAX_AGE": "a fortnight"}, "FLOODGATE_EVENT_MAX_AGE"},
		{"message limit too small", map[string]string{"FLOODGATE_STREAM_MAX_MESSAGE_BYTES": "10"}, "FLOODGATE_STREAM_MAX_MESSAGE_BYTES"},
		{"decompressed below message", map[string]string{"FLOODGATE_STREAM_MAX_MESSAGE_BYTES": "1048576", "FLOODGATE_STREAM_MAX_DECOMPRESSED_BYTES": "2048"}, "FLOODGATE_STREAM_MAX_DECOMPRESSED_BYTES"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ledger.ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.wantErr == "" {
				require.NoError(t, err)
				require.Equal(t, ledger.DefaultAddr, cfg.HTTPAddr)
				require.Equal(t, time.Second, cfg.FlushInterval)
				require.Equal(t, 400, cfg.RetentionDays)
				require.Equal(t, stream.DoorLimits{MaxMessageBytes: 256 << 10, MaxDecompressedBytes: 16 << 20,
					MaxEventFuture: 2 * time.Minute, MaxEventAge: 15 * 24 * time.Hour}, cfg.Door)
				require.Equal(t, 6*time.Second, cfg.SessionTimeout)
				require.Equal(t, time.Second, cfg.HeartbeatInterval)
				require.Equal(t, 20*time.Second, cfg.RebalanceTimeout)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}
