package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"

	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

type scopeRow struct {
	Scope   string
	Scale   float64
	Engaged string
	Held    string
}

type adjusterView struct {
	Title    string
	Settings adjuster.Settings
	ETag     string
	Rules    string // pretty JSON, or what the user sent back after a refusal
	Status   adjuster.Status
	Scopes   []scopeRow
	History  []adjuster.AuditRecord
	Console  []store.AuditEntry
	Loaded   bool
	Done     string
	editState
}

var adjusterDone = map[string]string{
	"mode":  "Mode changed. The adjuster's loop uses it from its next tick.",
	"rules": "Rules changed. The adjuster's loop uses them from its next tick.",
}

func (s *Server) loadAdjuster(r *http.Request) adjusterView {
	v := adjusterView{Title: "Adjuster", editState: editStateFor(r)}
	if s.cfg.Adjuster == nil {
		v.readOnly("No adjuster is configured (FLOODGATE_CONSOLE_ADJUSTER_URL, FLOODGATE_CONSOLE_ADJUSTER_TOKEN).")
		return v
	}
	ctx := r.Context()
	var err error
	if v.Settings, v.ETag, err = s.cfg.Adjuster.Settings(ctx); err != nil {
		v.readOnly("Adjuster settings unavailable: " + err.Error())
	} else {
		v.Loaded = true
		var buf bytes.Buffer
		if json.Indent(&buf, v.Settings.Rules, "", "  ") == nil {
			v.Rules = buf.String()
		}
	}
	if v.Status, err = s.cfg.Adjuster.Status(ctx); err != nil {
		v.Errors = append(v.Errors, "Adjuster status unavailable: "+err.Error())
	}
	for scope, val := range v.Status.Scales {
		v.Scopes = append(v.Scopes, scopeRow{Scope: scope, Scale: val, Engaged: strings.Join(v.Status.Engaged[scope], ", "), Held: v.Status.Held[scope]})
	}
	sort.Slice(v.Scopes, func(i, j int) bool { return v.Scopes[i].Scope < v.Scopes[j].Scope })
	if v.History, err = s.cfg.Adjuster.Audit(ctx, 50); err != nil {
		v.Errors = append(v.Errors, "Adjuster audit unavailable: "+err.Error())
	}
	if v.Console, err = s.cfg.Store.AuditOf(ctx, store.SubjectAdjuster, 20); err != nil {
		v.Errors = append(v.Errors, "Console audit log unavailable: "+err.Error())
	}
	return v
}

func (s *Server) adjusterPage(w http.ResponseWriter, r *http.Request) {
	v := s.loadAdjuster(r)
	v.Done = adjusterDone[r.URL.Query().Get("done")]
	if !v.Loaded {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	s.render(w, r, "adjuster", v)
}

// adjusterChange forwards one change to the adjuster with the ETag the form
// was rendered with, then writes the console's own audit row.
func (s *Server) adjusterChange(w http.ResponseWriter, r *http.Request, action, done string,
	call func(etag, corr, reason string) (adjuster.Result, any, error)) {
	who := s.actor(r)
	refuse := func(code int, msg string) {
		s.refuse(w, r, action, code, msg, func(msg string) {
			v := s.loadAdjuster(r)
			v.Errors = append([]string{msg}, v.Errors...)
			if action == store.ActionAdjusterRules {
				v.Rules = r.PostFormValue("rules") // keep the edit
			}
			s.renderCode(w, r, code, "adjuster", v)
		})
	}
	switch {
	case s.cfg.Adjuster == nil:
		refuse(http.StatusServiceUnavailable, "no adjuster is configured")
		return
	case who.Reason == "":
		refuse(http.StatusUnprocessableEntity, "a reason is required")
		return
	case len(who.Reason) > store.MaxReason:
		refuse(http.StatusUnprocessableEntity, fmt.Sprintf("the reason is longer than %d bytes", store.MaxReason))
		return
	}
	etag := r.PostFormValue("etag")
	if etag == "" {
		refuse(http.StatusUnprocessableEntity, "the form carries no settings version (ETag); reload the page")
		return
	}
	// The adjuster audits the console's token; the forwarded reason names the person.
	res, before, err := call(etag, who.CorrelationID, who.Reason+" (console user "+who.Name+")")
	var ae *adjuster.Error
	switch {
	case errors.As(err, &ae) && ae.Status == http.StatusPreconditionFailed:
		refuse(http.StatusConflict, "The settings changed since this page was loaded (someone else saved first); nothing was changed. Review the current settings below and submit again.")
		return
	case errors.As(err, &ae) && ae.Status < 500:
		refuse(ae.Status, "The adjuster refused the change: "+ae.Message)
		return
	case err != nil:
		s.cfg.Log.Error("adjuster change", "action", action, "err", err, "correlation_id", who.CorrelationID)
		refuse(http.StatusBadGateway, "The adjuster could not be reached; nothing was changed: "+err.Error())
		return
	}
	after := map[string]any{"version": res.Settings.Version, "dry_run": res.Settings.DryRun, "frozen": res.Settings.Frozen}
	if action == store.ActionAdjusterRules {
		after["rules"] = res.Settings.Rules
	}
	if err := s.cfg.Store.RecordRemote(r.Context(), store.SubjectAdjuster, action, res.AuditID, who, before, after); err != nil {
		// The adjuster applied and audited the change (res.AuditID); say so.
		s.metrics.actions.WithLabelValues(action, "audit_error").Inc()
		s.cfg.Log.Error("console audit row", "action", action, "adjuster_audit_id", res.AuditID, "err", err, "correlation_id", who.CorrelationID)
		s.fail(w, r, http.StatusServiceUnavailable, fmt.Sprintf("The adjuster applied the change (its audit id %s) but the console's own audit row failed: %v", res.AuditID, err))
		return
	}
	s.succeeded(w, r, action, who, map[string]any{"ok": true, "action": action, "version": res.Settings.Version, "adjuster_audit_id": res.AuditID},
		"/sre/adjuster?done="+done, "version", res.Settings.Version)
}

func (s *Server) adjusterMode(w http.ResponseWriter, r *http.Request) {
	dry, frozen := r.PostFormValue("dry_run") == "on", r.PostFormValue("frozen") == "on"
	s.adjusterChange(w, r, store.ActionAdjusterMode, "mode", func(etag, corr, reason string) (adjuster.Result, any, error) {
		cur, _, err := s.cfg.Adjuster.Settings(r.Context())
		if err != nil {
			return adjuster.Result{}, nil, err
		}
		before := map[string]any{"version": cur.Version, "dry_run": cur.DryRun, "frozen": cur.Frozen}
		res, err := s.cfg.Adjuster.PutMode(r.Context(), etag, corr, dry, frozen, reason)
		return res, before, err
	})
}

func (s *Server) adjusterRules(w http.ResponseWriter, r *http.Request) {
	raw := strings.TrimSpace(r.PostFormValue("rules"))
	s.adjusterChange(w, r, store.ActionAdjusterRules, "rules", func(etag, corr, reason string) (adjuster.Result, any, error) {
		var obj map[string]json.RawMessage
		if err := json.Unmarshal([]byte(raw), &obj); err != nil || len(obj) == 0 {
			return adjuster.Result{}, nil, &adjuster.Error{Service: "adjuster", Status: http.StatusUnprocessableEntity, Code: "invalid",
				Message: "the rules must be a JSON object of the fields to change (e.g. {\"cpu_high\":{\"above\":0.9,…}})"}
		}
		cur, _, err := s.cfg.Adjuster.Settings(r.Context())
		if err != nil {
			return adjuster.Result{}, nil, err
		}
		res, err := s.cfg.Adjuster.PutRules(r.Context(), etag, corr, json.RawMessage(raw), reason)
		return res, map[string]any{"version": cur.Version, "rules": cur.Rules}, err
	})
}
