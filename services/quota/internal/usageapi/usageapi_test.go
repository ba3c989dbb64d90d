package usageapi_test

import (
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
	"github.com/floodgate-dev/floodgate/services/quota/internal/usageapi"
)

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
		wantType   string
	}{
		{"three days", "/v1/usage/bot/abc?days=3", nil, http.StatusOK, "2026-03-08", ""},
		{"today by default", "/v1/usage/bot/abc", nil, http.StatusOK, "2026-03-10", ""},
		{"unknown kind", "/v1/usage/robot/abc", nil, http.StatusBadRequest, "", httpapi.ProblemInvalidRequest},
		{"days not a number", "/v1/usage/bot/abc?days=x", nil, http.StatusBadRequest, "", httpapi.ProblemInvalidRequest},
		{"too many days", "/v1/usage/bot/abc?days=401", nil, http.StatusBadRequest, "", httpapi.ProblemInvalidRequest},
		{"ledger down", "/v1/usage/bot/abc", errors.New("boom"), http.StatusServiceUnavailable, "", httpapi.ProblemUnavailable},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			r := &fakeReader{days: days, err: tc.err}
			mux := httpapi.NewMux()
			usageapi.Register(mux, r, nil, func() time.Time { return now }, nil)
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			req.Header.Set(httpapi.HeaderRequestID, "usage-1")
			httpapi.Middleware(httpapi.Options{}, mux).ServeHTTP(rec, req)
			require.Equal(t, tc.wantStatus, rec.Code, rec.Body.String())
			require.Equal(t, "usage-1", rec.Header().Get(httpapi.HeaderRequestID))
			if tc.wantStatus != http.StatusOK {
				require.Equal(t, httpapi.ContentTypeProblem, rec.Header().Get("Content-Type"))
				var p httpapi.Problem
				require.NoError(t, json.Unmarshal(rec.Body.Bytes(), &p))
				require.Equal(t, tc.wantType, p.Type)
				require.Equal(t, "usage-1", p.CorrelationID)
				require.NotContains(t, p.Detail, "boom", "a store error's detail stays in the log")
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

// TestSecurityUsageNeedsATokenS14: with FLOODGATE_QUOTA_TOKENS set, usage is
// read only with a reader token (issue 22 S14: anyone could read it).
func TestSecurityUsageNeedsATokenS14(t *testing.T) {
	tok, err := httpapi.NewToken("fgq_")
	require.NoError(t, err)
	tokens, err := usageapi.ParseTokens("console:reader:" + httpapi.HashToken(tok))
	require.NoError(t, err)
	r := &fakeReader{days: []ledger.DayUsage{{Day: "2026-03-10", Units: 7}}}
	mux := httpapi.NewMux()
	usageapi.Register(mux, r, tokens, func() time.Time { return time.Date(2026, 3, 10, 15, 0, 0, 0, time.UTC) }, nil)
	h := httpapi.Middleware(httpapi.Options{}, mux)
	for name, tc := range map[string]struct {
		auth string
		want int
	}{
		"no token":    {"", http.StatusUnauthorized},
		"wrong token": {"Bearer fgq_not-the-token", http.StatusUnauthorized},
		"reader":      {"Bearer " + tok, http.StatusOK},
	} {
		t.Run(name, func(t *testing.T) {
			rec := httptest.NewRecorder()
			req := httptest.NewRequest(http.MethodGet, "/v1/usage/bot/abc", nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			h.ServeHTTP(rec, req)
			require.Equal(t, tc.want, rec.Code, rec.Body.String())
			if tc.want != http.StatusOK {
				require.NotContains(t, rec.Body.String(), `"today"`, "no usage in a refusal")
			}
		})
	}
}
