package web

import (
	"errors"
	"net/http"
	"time"

	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// apiAlerts is GET /api/v1/alerts: the alerts list's page as JSON, with the
// same filters (pattern, severity, status, window, limit, cursor).
func (s *Server) apiAlerts(w http.ResponseWriter, r *http.Request) {
	f, _, err := s.filter(r)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	list, next, err := s.cfg.Store.List(r.Context(), f)
	if errors.Is(err, store.ErrBadCursor) {
		s.fail(w, r, http.StatusBadRequest, "bad cursor")
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "abuse records unavailable")
		return
	}
	type item struct {
		ID         string    `json:"id"`
		Principal  string    `json:"principal"`
		Key        string    `json:"key"`
		Pattern    string    `json:"pattern"`
		Severity   string    `json:"severity"`
		Score      float64   `json:"score"`
		Status     string    `json:"status"`
		DetectedAt time.Time `json:"detected_at"`
	}
	out := make([]item, 0, len(list))
	for _, a := range list {
		out = append(out, item{a.ID, a.Principal, a.SK, a.Pattern, a.Severity, a.Score, a.Status, a.DetectedAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"alerts": out, "next": next})
}
