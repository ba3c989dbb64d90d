package ledger_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stream"
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

type fakeReader struct {
	days []ledger.DayUsage
	err  error
	got  struct {
		principal string
		from, to  time.Time
	}
}

func (f *fakeReader) Usage(_ context.Context, principal string, from, to time.Time) ([]ledger.DayUsage, error) {
	f.got.principal, f.got.from, f.got.to = principal, from, to
	return f.days, f.err
}

func TestUsageHandler(t *testing.T) {
	now := time.Date(2026, 3, 10, 15, 0, 0, 0, time.UTC)
	days := []ledger.DayUsage{{Day: "2026-03-08", Units: 5}, {Day: "2026-03-09", Units: 0}, {Day: "2026-03-10", Units: 7}}
	tests := []struct {
		name       string
		path       string
		err        error
		wantStatus int
		wantFrom   string
	}{
		{"three days", "/v1/usage/bot/abc?days=3", nil, http.StatusOK, "2026-03-08"},
		{"today by default", "/v1/usage/bot/abc", nil, http.StatusOK, "2026-03-10"},
		{"unknown kind", "/v1/usage/robot/abc", nil, http.StatusBadRequest, ""},
		{"days not a number", "/v1/usage/bot/abc?days=x", nil, http.StatusBadRequest, ""},
		{"too many days", "/v1/usage/bot/abc?days=401", nil, http.StatusBadRequest, ""},
		{"ledger down", "/v1/usage/bot/abc", errors.New("boom"), http.StatusServiceUnavailable, ""},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeReader{days: days, err: tc.err}
			mux := http.NewServeMux()
			mux.Handle("GET /v1/usage/{kind}/{id}", ledger.UsageHandler(r, func() time.Time { return now }))
			rec := httptest.NewRecorder()
			mux.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, tc.path, nil))
			require.Equal(t, tc.wantStatus, rec.Code, rec.Body.String())
			if tc.wantStatus != http.StatusOK {
				require.Equal(t, "application/problem+json", rec.Header().Get("Content-Type"))
				return
			}
			require.Equal(t, "bot:abc", r.got.principal)
			require.Equal(t, tc.wantFrom, r.got.from.Format(ledger.DayLayout))
			var rep ledger.Report
			require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &rep))
			require.Equal(t, ledger.Report{Principal: "bot:abc", Today: 7, Total: 12, Days: days}, rep)
		})
	}
}
