package ledger

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// MaxDays is the longest window the usage API and CLI return.
const MaxDays = 400

// UsageReader reads a principal's ledger: *Store.
type UsageReader interface {
	Usage(ctx context.Context, principal string, from, to time.Time) ([]DayUsage, error)
}

var _ UsageReader = (*Store)(nil)

// Report is a principal's usage over the last days, oldest first; the last
// day is today (UTC).
type Report struct {
	Principal string     `json:"principal"`
	Today     int64      `json:"today"`
	Total     int64      `json:"total"`
	Days      []DayUsage `json:"days"`
}

// ErrBadRequest is wrapped by UsageReport's errors about its arguments.
var ErrBadRequest = errors.New("bad usage request")

// UsageReport validates the principal and days and reads the ledger for the
// last days days, today included.
func UsageReport(ctx context.Context, r UsageReader, kind, id string, days int, now time.Time) (Report, error) {
	p := events.Principal{Kind: events.PrincipalKind(kind), ID: id}
	if err := p.Validate(); err != nil {
		return Report{}, fmt.Errorf("%w: principal: %w", ErrBadRequest, err)
	}
	if days < 1 || days > MaxDays {
		return Report{}, fmt.Errorf("%w: days %d: must be in 1..%d", ErrBadRequest, days, MaxDays)
	}
	to := now.UTC()
	from := to.Add(-time.Duration(days-1) * 24 * time.Hour)
	list, err := r.Usage(ctx, p.Key(), from, to)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Principal: p.Key(), Days: list}
	for _, d := range list {
		rep.Total += d.Units
	}
	if len(list) > 0 {
		rep.Today = list[len(list)-1].Units
	}
	return rep, nil
}

// UsageHandler serves GET /v1/usage/{kind}/{id}?days=N (default 1: today).
func UsageHandler(r UsageReader, now func() time.Time) http.HandlerFunc {
	return func(w http.ResponseWriter, req *http.Request) {
		days := 1
		if v := req.URL.Query().Get("days"); v != "" {
			n, err := strconv.Atoi(v)
			if err != nil {
				writeProblem(w, http.StatusBadRequest, fmt.Sprintf("days=%q: want an integer in 1..%d", v, MaxDays))
				return
			}
			days = n
		}
		rep, err := UsageReport(req.Context(), r, req.PathValue("kind"), req.PathValue("id"), days, now())
		switch {
		case errors.Is(err, ErrBadRequest):
			writeProblem(w, http.StatusBadRequest, err.Error())
			return
		case err != nil:
			writeProblem(w, http.StatusServiceUnavailable, "ledger unavailable")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_ = json.NewEncoder(w).Encode(rep)
	}
}

func writeProblem(w http.ResponseWriter, status int, detail string) {
	w.Header().Set("Content-Type", "application/problem+json")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(map[string]any{
		"type": "about:blank", "title": http.StatusText(status), "status": status, "detail": detail,
	})
}
