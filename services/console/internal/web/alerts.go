package web

import (
	"errors"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

var (
	patterns   = []string{string(events.PatternRapidFire), string(events.PatternDistributedIP), string(events.PatternBotLike), string(events.PatternCredentialStuffing), string(events.PatternScraping)}
	severities = []string{string(events.SeverityLow), string(events.SeverityMedium), string(events.SeverityHigh), string(events.SeverityCritical)}
	windows    = []struct{ Value, Label string }{{"1h", "last hour"}, {"24h", "last 24 hours"}, {"168h", "last 7 days"}, {"720h", "last 30 days"}}
)

func oneOf(v string, allowed []string) bool {
	for _, a := range allowed {
		if a == v {
			return true
		}
	}
	return false
}

type listView struct {
	Title             string
	Pattern, Severity string
	Status, Window    string
	Patterns          []string
	Severities        []string
	Statuses          []string
	Windows           []struct{ Value, Label string }
	Alerts            []store.Alert
	Next              string
	Query             template.URL
	First             bool
	Latest            string
	PollMS            int64
	Error             string
	CanAct            bool
}

func (s *Server) filter(r *http.Request) (store.Filter, listView, error) {
	q := r.URL.Query()
	v := listView{Title: "Alerts", Pattern: q.Get("pattern"), Severity: q.Get("severity"), Status: q.Get("status"), Window: q.Get("window"),
		Patterns: patterns, Severities: severities, Statuses: store.Statuses, Windows: windows, First: q.Get("cursor") == "",
		PollMS: s.cfg.PollInterval.Milliseconds()}
	if v.Window == "" {
		v.Window = "168h"
	}
	var errs []string
	if v.Pattern != "" && !oneOf(v.Pattern, patterns) {
		errs = append(errs, "pattern must be one of "+strings.Join(patterns, ", "))
	}
	if v.Severity != "" && !oneOf(v.Severity, severities) {
		errs = append(errs, "severity must be one of "+strings.Join(severities, ", "))
	}
	if v.Status != "" && !oneOf(v.Status, store.Statuses) {
		errs = append(errs, "status must be one of "+strings.Join(store.Statuses, ", "))
	}
	win, err := time.ParseDuration(v.Window)
	if err != nil || win <= 0 || win > store.MaxDays*24*time.Hour {
		errs = append(errs, "window must be a duration up to 744h")
		win = 168 * time.Hour
	}
	now := s.cfg.Now()
	f := store.Filter{Pattern: v.Pattern, Severity: v.Severity, Status: v.Status, Since: now.Add(-win), Until: now,
		PageSize: 25, Cursor: q.Get("cursor")}
	if n, err := strconv.Atoi(q.Get("limit")); err == nil && n >= 1 && n <= 200 {
		f.PageSize = n
	}
	keep := url.Values{}
	for _, k := range []string{"pattern", "severity", "status", "window"} {
		if q.Get(k) != "" {
			keep.Set(k, q.Get(k))
		}
	}
	v.Query = template.URL(keep.Encode()) // #nosec: built by url.Values.Encode
	if len(errs) > 0 {
		return f, v, errors.New(strings.Join(errs, "; "))
	}
	return f, v, nil
}

func (s *Server) alerts(w http.ResponseWriter, r *http.Request) {
	f, v, err := s.filter(r)
	v.CanAct = current(r).who.Role.Allows(auth.RoleAnalyst)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		v.Error = err.Error()
		s.render(w, r, "alerts", v)
		return
	}
	v.Alerts, v.Next, err = s.cfg.Store.List(r.Context(), f)
	switch {
	case errors.Is(err, store.ErrBadCursor):
		w.WriteHeader(http.StatusBadRequest)
		v.Error = "That page link is not valid any more; start from the first page."
	case err != nil:
		s.cfg.Log.Error("list alerts", "err", err)
		w.WriteHeader(http.StatusServiceUnavailable)
		v.Error = "The abuse records could not be read (DynamoDB): " + err.Error()
	}
	// New alerts are polled from the newest one shown (or five minutes back).
	v.Latest = s.cfg.Now().UTC().Add(-5 * time.Minute).Format("2006-01-02T15:04:05.000Z")
	if len(v.Alerts) > 0 && v.Alerts[0].GSI1SK > v.Latest {
		v.Latest = v.Alerts[0].GSI1SK
	}
	s.render(w, r, "alerts", v)
}

// newAlerts answers the alerts page's polling: rows newer than after, as an
// HTML fragment, with the newest one's key in X-Latest.
func (s *Server) newAlerts(w http.ResponseWriter, r *http.Request) {
	f, v, err := s.filter(r)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	after := r.URL.Query().Get("after")
	if _, err := time.Parse("2006-01-02T15:04:05.000Z", after); err != nil {
		s.fail(w, r, http.StatusBadRequest, "after must be a detected_at key (2006-01-02T15:04:05.000Z)")
		return
	}
	f.After, f.Cursor, f.PageSize = after, "", 50
	at, _ := time.Parse("2006-01-02T15:04:05.000Z", after)
	f.Since = at
	v.Alerts, _, err = s.cfg.Store.List(r.Context(), f)
	if err != nil {
		s.cfg.Log.Error("poll alerts", "err", err)
		s.fail(w, r, http.StatusServiceUnavailable, "abuse records unavailable")
		return
	}
	latest := after
	for _, a := range v.Alerts {
		if a.GSI1SK > latest {
			latest = a.GSI1SK
		}
	}
	w.Header().Set("X-Latest", latest)
	w.Header().Set("X-New-Count", strconv.Itoa(len(v.Alerts)))
	s.render(w, r, "rows", v)
}
