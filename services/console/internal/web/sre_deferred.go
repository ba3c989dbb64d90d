package web

import (
	"context"
	"errors"
	"net/http"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// Audit subject and actions of the deferred-work page (docs/deferred.md).
const (
	SubjectDeferred       = "console#deferred"
	ActionDeferredPause   = "deferred.pause"
	ActionDeferredResume  = "deferred.resume"
	ActionDeferredDrain   = "deferred.drain"
	ActionDeferredUndrain = "deferred.undrain"
)

type deferredRow struct {
	deferred.Depth
	Age time.Duration // of the oldest waiting request
}

type deferredView struct {
	Title  string
	Routes []deferredRow
	Audit  []store.AuditEntry
	Done   string
	editState
}

func (s *Server) loadDeferred(r *http.Request) deferredView {
	v := deferredView{Title: "Deferred work", editState: editStateFor(r)}
	if s.cfg.Deferred == nil {
		v.readOnly("Deferred work is not configured (the console has no Redis store for it).")
		return v
	}
	routes, err := s.cfg.Deferred.Routes(r.Context())
	if err != nil {
		v.readOnly("Deferred queues could not be read (Redis): " + err.Error())
	}
	now := s.cfg.Now()
	for _, route := range routes {
		d, err := s.cfg.Deferred.Depth(r.Context(), route)
		if err != nil {
			v.Errors = append(v.Errors, "Queue of "+route+" could not be read: "+err.Error())
			continue
		}
		row := deferredRow{Depth: d}
		if !d.OldestQueued.IsZero() {
			row.Age = now.Sub(d.OldestQueued).Round(time.Second)
		}
		v.Routes = append(v.Routes, row)
	}
	if v.Audit, err = s.cfg.Store.AuditOf(r.Context(), SubjectDeferred, 30); err != nil {
		v.Errors = append(v.Errors, "Console audit log unavailable: "+err.Error())
	}
	return v
}

var deferredDone = map[string]string{
	ActionDeferredPause:   "Replay paused: the workers hold this route's requests (their deadlines still run).",
	ActionDeferredResume:  "Replay resumed.",
	ActionDeferredDrain:   "Draining: the edges answer this route's denied requests with the plain 429; the queued ones are still replayed.",
	ActionDeferredUndrain: "Deferring again.",
}

func (s *Server) deferredPage(w http.ResponseWriter, r *http.Request) {
	v := s.loadDeferred(r)
	v.Done = deferredDone[r.URL.Query().Get("done")]
	s.render(w, r, "deferred", v)
}

// deferredAction pauses, resumes, drains or un-drains one route's deferred
// work, audited; a change whose audit row cannot be written is undone.
func (s *Server) deferredAction(w http.ResponseWriter, r *http.Request) {
	route := strings.TrimSpace(r.PostFormValue("route"))
	action := r.PostFormValue("action")
	who := s.actor(r)
	fail := func(code int, msg string) {
		s.refuse(w, r, action, code, msg, func(msg string) {
			v := s.loadDeferred(r)
			v.Errors = append([]string{msg}, v.Errors...)
			s.renderCode(w, r, code, "deferred", v)
		})
	}
	if s.cfg.Deferred == nil {
		fail(http.StatusServiceUnavailable, "Deferred work is not configured.")
		return
	}
	method, tmpl, ok := strings.Cut(route, " ")
	if !ok || method == "" || !strings.HasPrefix(tmpl, "/") || len(route) > 300 {
		fail(http.StatusUnprocessableEntity, "Name a route as METHOD /template, e.g. POST /orders.")
		return
	}
	set := map[string]func(ctx context.Context, by string) error{
		ActionDeferredPause:   func(ctx context.Context, by string) error { return s.cfg.Deferred.SetPaused(ctx, route, by) },
		ActionDeferredResume:  func(ctx context.Context, _ string) error { return s.cfg.Deferred.SetPaused(ctx, route, "") },
		ActionDeferredDrain:   func(ctx context.Context, by string) error { return s.cfg.Deferred.SetDraining(ctx, route, by) },
		ActionDeferredUndrain: func(ctx context.Context, _ string) error { return s.cfg.Deferred.SetDraining(ctx, route, "") },
	}
	undo := map[string]string{ActionDeferredPause: ActionDeferredResume, ActionDeferredResume: ActionDeferredPause,
		ActionDeferredDrain: ActionDeferredUndrain, ActionDeferredUndrain: ActionDeferredDrain}
	do, ok := set[action]
	if !ok {
		fail(http.StatusUnprocessableEntity, "Unknown action "+action+".")
		return
	}
	if who.Reason == "" {
		fail(http.StatusUnprocessableEntity, "Give a reason: it goes into the audit log.")
		return
	}
	before, err := s.cfg.Deferred.Depth(r.Context(), route)
	if err != nil {
		fail(http.StatusServiceUnavailable, "The queue could not be read (Redis): "+err.Error())
		return
	}
	if err := do(r.Context(), who.Name); err != nil {
		fail(http.StatusServiceUnavailable, "Nothing was changed (Redis): "+err.Error())
		return
	}
	after, _ := s.cfg.Deferred.Depth(r.Context(), route)
	if err := s.cfg.Store.RecordRemote(r.Context(), SubjectDeferred, action, route, who, before, after); err != nil {
		_ = set[undo[action]](context.WithoutCancel(r.Context()), who.Name)
		code := http.StatusServiceUnavailable
		if errors.Is(err, store.ErrInvalid) {
			code = http.StatusUnprocessableEntity
		}
		fail(code, "Not changed: the audit log could not be written: "+err.Error())
		return
	}
	s.succeeded(w, r, action, who, map[string]any{"ok": true, "action": action, "route": route}, "/sre/deferred?done="+action, "route", route)
}
