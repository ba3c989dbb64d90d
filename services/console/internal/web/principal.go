package web

import (
	"context"
	"html/template"
	"net/http"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// UsageDays is how many days of quota usage the principal page shows.
const UsageDays = 14

type principalView struct {
	Title     string
	Principal string
	Kind, ID  string
	principalState
	Usage      quota.Report
	UsageOK    bool
	UsageError string
	Timeline   template.HTML
	Errors     []string
}

// principalState is what the console knows of one principal now: its live
// penalty, its allowlist entry, its newest detections and its audit log.
type principalState struct {
	Penalty    store.Penalty
	HasPenalty bool
	Allow      store.AllowEntry
	Allowed    bool
	History    []store.Alert
	Audit      []store.AuditEntry
}

// loadPrincipal reads a principal's state with its newest history
// detections (named so in the errors, which say what could not be read).
func (s *Server) loadPrincipal(ctx context.Context, key string, history int, what string) (principalState, []string) {
	var (
		p    principalState
		errs []string
		err  error
	)
	if p.Penalty, p.HasPenalty, err = s.cfg.Store.GetPenalty(ctx, key); err != nil {
		errs = append(errs, "live penalty unavailable (Redis): "+err.Error())
	}
	if p.Allow, p.Allowed, err = s.cfg.Store.GetAllow(ctx, key); err != nil {
		errs = append(errs, "allowlist unavailable: "+err.Error())
	}
	if p.History, err = s.cfg.Store.History(ctx, key, history); err != nil {
		errs = append(errs, what+" unavailable: "+err.Error())
	}
	if p.Audit, err = s.cfg.Store.AuditLog(ctx, key, 20); err != nil {
		errs = append(errs, "audit log unavailable: "+err.Error())
	}
	return p, errs
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
	v.principalState, v.Errors = s.loadPrincipal(ctx, key, 50, "detections (DynamoDB)")
	var err error
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
