package ledger_test

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
)

func TestConfigFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		wantErr string
	}{
		{"defaults are valid", map[string]string{}, ""},
		{"flush interval too short", map[string]string{"FLOODGATE_QUOTA_FLUSH_INTERVAL": "1ms"}, "FLOODGATE_QUOTA_FLUSH_INTERVAL"},
		{"flush interval malformed", map[string]string{"FLOODGATE_QUOTA_FLUSH_INTERVAL": "soon"}, "FLOODGATE_QUOTA_FLUSH_INTERVAL"},
		{"retention out of range", map[string]string{"FLOODGATE_QUOTA_RETENTION_DAYS": "0"}, "FLOODGATE_QUOTA_RETENTION_DAYS"},
		{"heartbeat not below session", map[string]string{"FLOODGATE_QUOTA_SESSION_TIMEOUT": "1s", "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL": "1s"}, "FLOODGATE_QUOTA_HEARTBEAT_INTERVAL"},
		{"no concurrency", map[string]string{"FLOODGATE_QUOTA_WRITE_CONCURRENCY": "0"}, "FLOODGATE_QUOTA_WRITE_CONCURRENCY"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			cfg, err := ledger.ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.wantErr == "" {
				require.NoError(t, err)
				require.Equal(t, ledger.DefaultAddr, cfg.HTTPAddr)
				require.Equal(t, time.Second, cfg.FlushInterval)
				require.Equal(t, 400, cfg.RetentionDays)
				return
			}
			require.ErrorContains(t, err, tc.wantErr)
		})
	}
}
