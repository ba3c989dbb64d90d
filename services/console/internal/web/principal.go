package web

import (
	"html/template"
	"net/http"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// UsageDays is how many days of quota usage the principal page shows.
const UsageDays = 14

type principalView struct {
	Title      string
	Principal  string
	Kind, ID   string
	Penalty    store.Penalty
	HasPenalty bool
	Allow      store.AllowEntry
	Allowed    bool
	History    []store.Alert
	Audit      []store.AuditEntry
	Usage      quota.Report
	UsageOK    bool
	UsageError string
	Timeline   template.HTML
	Errors     []string
}

// principal shows one principal: its live penalty, detections, audit log and
// the quota service's daily usage with a timeline chart.
func (s *Server) principal(w http.ResponseWriter, r *http.Request) {
	p := events.Principal{Kind: events.PrincipalKind(r.PathValue("kind")), ID: r.PathValue("id")}
	if err := p.Validate(); err != nil {
		s.fail(w, r, http.StatusNotFound, "no such principal: "+err.Error())
		return
	}
	ctx := r.Context()
	key := p.Key()
	v := principalView{Title: key, Principal: key, Kind: string(p.Kind), ID: p.ID}
	var err error
	if v.Penalty, v.HasPenalty, err = s.cfg.Store.GetPenalty(ctx, key); err != nil {
		v.Errors = append(v.Errors, "live penalty unavailable (Redis): "+err.Error())
	}
	if v.Allow, v.Allowed, err = s.cfg.Store.GetAllow(ctx, key); err != nil {
		v.Errors = append(v.Errors, "allowlist unavailable: "+err.Error())
	}
	if v.History, err = s.cfg.Store.History(ctx, key, 50); err != nil {
		v.Errors = append(v.Errors, "detections unavailable (DynamoDB): "+err.Error())
	}
	if v.Audit, err = s.cfg.Store.AuditLog(ctx, key, 20); err != nil {
		v.Errors = append(v.Errors, "audit log unavailable: "+err.Error())
	}
	if s.cfg.Quota == nil {
		v.UsageError = "No quota service is configured (FLOODGATE_CONSOLE_QUOTA_URL)."
	} else if v.Usage, err = s.cfg.Quota.Usage(ctx, string(p.Kind), p.ID, UsageDays); err != nil {
		s.cfg.Log.Warn("quota usage", "principal", key, "err", err)
		v.UsageError = "Quota usage is unavailable (quota service): " + err.Error()
	} else {
		v.UsageOK = true
		v.Timeline = usageChart(v.Usage.Days, v.History)
	}
	s.render(w, r, "principal", v)
}
