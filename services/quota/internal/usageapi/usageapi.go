// Package usageapi is the quota service's HTTP API: a principal's daily
// usage from the ledger (GET /v1/usage/{kind}/{id}?days=N). Errors are
// RFC 9457 problems (pkg/httpapi).
package usageapi

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
)

// Roles of the usage API's tokens: reader reads usage.
func Roles() httpapi.Roles { return httpapi.Roles{"reader"} }

// ParseTokens reads FLOODGATE_QUOTA_TOKENS, a token spec (pkg/httpapi:
// name:reader:sha256hex entries).
func ParseTokens(spec string) (*httpapi.Tokens, error) { return httpapi.ParseTokenSpec(Roles(), spec) }

// Register adds the usage route to mux. With tokens, a caller must send one
// (Authorization: Bearer); nil serves anyone (loopback only, the config
// enforces it).
func Register(mux *httpapi.Mux, r ledger.UsageReader, tokens *httpapi.Tokens, now func() time.Time, log *slog.Logger) {
	var h http.Handler = Handler(r, now, log)
	if tokens != nil {
		auth := &httpapi.Auth{Tokens: tokens, Roles: Roles(), Realm: "floodgate-quota", Now: now,
			Audit: func(ctx context.Context, e httpapi.AuthEvent) {
				if e.Outcome != httpapi.AuthAllowed && log != nil {
					log.WarnContext(ctx, "usage api: refused", "outcome", e.Outcome, "caller", e.Caller.Name, "path", e.Path)
				}
			}}
		h = auth.Require("read usage", "reader", h)
	}
	mux.Handle("GET /v1/usage/{kind}/{id}", h)
}

// Handler serves GET /v1/usage/{kind}/{id}?days=N (default 1: today).
func Handler(r ledger.UsageReader, now func() time.Time, log *slog.Logger) http.Handler {
	return httpapi.Handle(log, func(w http.ResponseWriter, req *http.Request) error {
		days := 1
		if v := req.URL.Query().Get("days"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				return httpapi.BadRequest("days=%q: want an integer in 1..%d", v, ledger.MaxDays)
			}
			days = n
		}
		rep, err := ledger.UsageReport(req.Context(), r, req.PathValue("kind"), req.PathValue("id"), days, now())
		switch {
		case errors.Is(err, ledger.ErrBadRequest):
			return httpapi.BadRequest("%s", err.Error())
		case err != nil:
			if log != nil {
				log.WarnContext(req.Context(), "read usage", "err", err)
			}
			return httpapi.Errorf(http.StatusServiceUnavailable, httpapi.ProblemUnavailable, "ledger unavailable")
		}
		httpapi.WriteJSON(w, http.StatusOK, rep)
		return nil
	})
}
