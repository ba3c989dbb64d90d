package web

import (
	"fmt"
	"mime"
	"net/http"
	"strings"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// The answers every audited action (an alert's lift, an override, a rollout,
// a dead-letter replay, …) gives: who acted, what a refusal and a success
// look like to an API caller and to a browser, and how each is counted in
// floodgate_console_actions_total{action,outcome}.

// actor is the signed-in caller acting, with the form's reason.
func (s *Server) actor(r *http.Request) store.Actor {
	req := current(r)
	return store.Actor{Name: req.who.Name, Role: req.who.Role.String(), Reason: strings.TrimSpace(r.PostFormValue("reason")), CorrelationID: req.corr}
}

// readAction reads an action's request: an API caller's JSON body into a T
// (a malformed one is store.ErrInvalid), or a browser's form by fromForm.
func readAction[T any](r *http.Request, fromForm func() T) (T, error) {
	ct, _, _ := mime.ParseMediaType(r.Header.Get("Content-Type"))
	if ct == "application/json" {
		var in T
		if err := httpapi.DecodeJSON(r, &in); err != nil {
			return in, fmt.Errorf("%w: %w", store.ErrInvalid, err)
		}
		return in, nil
	}
	return fromForm(), nil
}

// outcome is a refusal's outcome label: "refused" (the caller's to fix)
// below 500, "error" from 500.
func outcome(code int) string {
	if code >= 500 {
		return "error"
	}
	return "refused"
}

// refuse answers an action that was refused or failed with code: it counts
// the outcome, answers an API caller with a problem carrying msg and a
// browser with page(msg), which renders the form again with msg first among
// its errors (renderCode).
func (s *Server) refuse(w http.ResponseWriter, r *http.Request, action string, code int, msg string, page func(msg string)) {
	s.metrics.actions.WithLabelValues(action, outcome(code)).Inc()
	if wantsJSON(r) {
		s.fail(w, r, code, msg)
		return
	}
	page(msg)
}

// renderCode renders a page with a status code other than 200.
func (s *Server) renderCode(w http.ResponseWriter, r *http.Request, code int, name string, data any) {
	w.WriteHeader(code)
	s.render(w, r, name, data)
}

// succeeded answers an action that was done: counted ok, logged as "action"
// with attrs (the actor and reason included) and the correlation id; an API
// caller gets body as JSON, a browser a redirect to next.
func (s *Server) succeeded(w http.ResponseWriter, r *http.Request, action string, who store.Actor, body any, next string, attrs ...any) {
	s.metrics.actions.WithLabelValues(action, "ok").Inc()
	attrs = append([]any{"action", action}, attrs...)
	s.cfg.Log.Info("action", append(attrs, "actor", who.Name, "reason", who.Reason, "correlation_id", who.CorrelationID)...)
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, body)
		return
	}
	http.Redirect(w, r, next, http.StatusSeeOther)
}
