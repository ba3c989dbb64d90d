package web

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

type overrideForm struct {
	Field, Value, Tag, Expires string
	Editing                    bool
}

type overridesView struct {
	Title string
	Key   string
	List  []store.Override
	Form  overrideForm
	Audit []store.AuditEntry
	Done  string
	editState
}

var overrideDone = map[string]string{
	"saved":   "Override saved. Every limiter applies it from its next refresh (about a second).",
	"deleted": "Override deleted. Every limiter drops it from its next refresh (about a second).",
}

// overrideExample prefills the create form.
const overrideExample = `{"limits": {"RULE-ID": 200}}`

func (s *Server) overridesKey() string {
	if s.cfg.OverridesKey == "" {
		return limiter.OverridesKey
	}
	return s.cfg.OverridesKey
}

func (s *Server) loadOverrides(r *http.Request) overridesView {
	v := overridesView{Title: "Limit overrides", Key: s.overridesKey(), editState: editStateFor(r),
		Form: overrideForm{Value: overrideExample}}
	var err error
	if v.List, err = s.cfg.Store.Overrides(r.Context(), v.Key); err != nil {
		v.readOnly("Overrides could not be read (Redis): " + err.Error())
	}
	if v.Audit, err = s.cfg.Store.AuditOf(r.Context(), store.SubjectOverrides, 30); err != nil {
		v.Errors = append(v.Errors, "Console audit log unavailable: "+err.Error())
	}
	return v
}

func (s *Server) overridesPage(w http.ResponseWriter, r *http.Request) {
	v := s.loadOverrides(r)
	v.Done = overrideDone[r.URL.Query().Get("done")]
	if edit := r.URL.Query().Get("edit"); edit != "" {
		found := false
		for _, o := range v.List {
			if o.Field == edit {
				v.Form = overrideForm{Field: o.Field, Value: pretty(o.Value), Tag: o.Tag, Editing: true}
				found = true
			}
		}
		if !found && v.Errors == nil {
			v.Errors = append(v.Errors, "There is no override "+edit+" (any more); create it below.")
			v.Form.Field = edit
		}
	}
	if v.List == nil && len(v.Errors) > 0 && strings.HasPrefix(v.Errors[0], "Overrides could not be read") {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	s.render(w, r, "overrides", v)
}

func pretty(v string) string {
	var buf bytes.Buffer
	if json.Indent(&buf, []byte(v), "", "  ") != nil {
		return v
	}
	return buf.String()
}

// overrideSave creates (tag empty) or replaces (tag of the value the form was
// rendered with) one override.
func (s *Server) overrideSave(w http.ResponseWriter, r *http.Request) {
	f := overrideForm{Field: strings.TrimSpace(r.PostFormValue("field")), Value: r.PostFormValue("value"),
		Tag: r.PostFormValue("tag"), Expires: strings.TrimSpace(r.PostFormValue("expires"))}
	f.Editing = f.Tag != ""
	s.overrideChange(w, r, store.ActionOverrideSet, "saved", f, func(ctx context.Context, who store.Actor) error {
		var until time.Time
		if f.Expires != "" {
			var err error
			if until, err = parseUntil(s.cfg.Now(), f.Expires); err != nil {
				return err
			}
		}
		return s.cfg.Store.SetOverride(ctx, s.overridesKey(), f.Field, f.Value, f.Tag, until, who)
	})
}

func (s *Server) overrideDelete(w http.ResponseWriter, r *http.Request) {
	f := overrideForm{Field: strings.TrimSpace(r.PostFormValue("field")), Tag: r.PostFormValue("tag")}
	s.overrideChange(w, r, store.ActionOverrideDelete, "deleted", f, func(ctx context.Context, who store.Actor) error {
		return s.cfg.Store.DeleteOverride(ctx, s.overridesKey(), f.Field, f.Tag, who)
	})
}

func (s *Server) overrideChange(w http.ResponseWriter, r *http.Request, action, done string, f overrideForm, do func(context.Context, store.Actor) error) {
	who := s.actor(r)
	err := do(r.Context(), who)
	if err == nil {
		s.succeeded(w, r, action, who, map[string]any{"ok": true, "action": action, "field": f.Field}, "/sre/overrides?done="+done+"#overrides", "override", f.Field)
		return
	}
	code, msg := http.StatusServiceUnavailable, err.Error()
	switch {
	case errors.Is(err, store.ErrInvalid):
		code = http.StatusUnprocessableEntity
	case errors.Is(err, store.ErrStale):
		code, msg = http.StatusConflict, "Someone changed "+f.Field+" since this page was loaded (or it already exists): nothing was changed. Its current value is in the list; edit that."
	case errors.Is(err, store.ErrNoOverride):
		code, msg = http.StatusNotFound, "There is no override "+f.Field+" (any more): nothing was changed."
	}
	if code >= 500 {
		s.cfg.Log.Error("action failed", "action", action, "override", f.Field, "actor", who.Name, "err", err, "correlation_id", who.CorrelationID)
	}
	s.refuse(w, r, action, code, msg, func(msg string) {
		v := s.loadOverrides(r)
		v.Errors = append([]string{msg}, v.Errors...)
		if action == store.ActionOverrideSet && code != http.StatusConflict {
			v.Form = f // keep the edit
		}
		s.renderCode(w, r, code, "overrides", v)
	})
}

// ExpireOverrides removes expired overrides every interval until ctx is done
// (the console's sweeper; every instance may run it, removal is conditional).
func (s *Server) ExpireOverrides(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	sweeper := store.Actor{Name: "console", Role: "system", CorrelationID: "override-expiry"}
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		}
		n, err := s.cfg.Store.ExpireOverrides(ctx, s.overridesKey(), sweeper)
		if n > 0 {
			s.metrics.actions.WithLabelValues(store.ActionOverrideExpire, "ok").Add(float64(n))
			s.cfg.Log.Info("expired overrides removed", "count", n)
		}
		if err != nil && ctx.Err() == nil {
			s.metrics.actions.WithLabelValues(store.ActionOverrideExpire, "error").Inc()
			s.cfg.Log.Warn("expire overrides", "err", err)
		}
	}
}
