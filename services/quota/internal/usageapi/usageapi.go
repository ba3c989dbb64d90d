// Package usageapi is the quota service's HTTP API: a principal's daily
// usage from the ledger (GET /v1/usage/{kind}/{id}?days=N). Errors are
// RFC 9457 problems (pkg/httpapi).
package usageapi

import (
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/quota/internal/ledger"
)

// Register adds the usage route to mux.
func Register(mux *http.ServeMux, r ledger.UsageReader, now func() time.Time, log *slog.Logger) {
	mux.Handle("GET /v1/usage/{kind}/{id}", Handler(r, now, log))
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
