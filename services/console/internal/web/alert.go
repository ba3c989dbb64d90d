package web

import (
	"errors"
	"fmt"
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

type ipView struct {
	IP      string
	Count   int64
	Shared  int64
	IsNAT   bool
	Allowed *store.AllowEntry // the network allowlist entry covering it
}

type detailView struct {
	Title string
	Alert store.Alert
	Ev    *events.Abuse
	IPs   []ipView
	principalState
	Chart     template.HTML
	ChartNote string // what the chart compares
	Samples   samplesView
	CIDRAllow map[string]store.AllowEntry // the alert's networks (address) → the CIDR entry covering it
	Networks  []string                    // the alert's networks as prefixes, to allowlist
	CanAct    bool
	IsAdmin   bool
	Done      string
	Errors    []string
	Version   string
}

var doneMessages = map[string]string{
	"lifted":           "Penalty lifted. The limiter stops applying it at the principal's next check.",
	"extended":         "Penalty extended.",
	"allowlisted":      "Principal allowlisted. The detector drops its detections from its next allowlist refresh (about 30 s).",
	"false_positive":   "Marked as a false positive and counted for the detector.",
	"cidr_allowlisted": "Network allowlisted. The detector stops acting on detections whose every top address is in allowlisted networks from its next refresh (about 30 s).",
}

func (s *Server) loadDetail(r *http.Request, principal, sk string) (detailView, error) {
	ctx := r.Context()
	a, err := s.cfg.Store.Get(ctx, principal, sk)
	if err != nil {
		return detailView{}, err
	}
	v := detailView{Title: "Alert " + a.ID, Alert: a, Ev: a.Event, CanAct: current(r).who.Role.Allows(auth.RoleAnalyst)}
	if a.Event != nil {
		v.Version = a.Event.DetectorVersion
		for _, ip := range a.Event.Evidence.TopIPs {
			v.IPs = append(v.IPs, ipView{IP: ip.IP.String(), Count: ip.Count, Shared: ip.SharedPrincipals, IsNAT: ip.SharedPrincipals >= 5})
		}
		v.Chart, v.ChartNote = evidenceChart(a.Event)
	}
	var errs []string
	v.principalState, errs = s.loadPrincipal(ctx, principal, 20, "history")
	v.Samples = s.loadSamples(ctx, a)
	v.IsAdmin = current(r).who.Role.Allows(auth.RoleAdmin)
	if err := s.loadCIDRAllow(ctx, &v); err != nil {
		errs = append(errs, "network allowlist unavailable: "+err.Error())
	}
	v.Errors = errs
	return v, nil
}

func (s *Server) alert(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	v, err := s.loadDetail(r, q.Get("p"), q.Get("k"))
	if errors.Is(err, store.ErrNotFound) || q.Get("p") == "" || q.Get("k") == "" {
		s.fail(w, r, http.StatusNotFound, "no such alert (it may have expired after 90 days)")
		return
	}
	if err != nil {
		s.cfg.Log.Error("read alert", "err", err)
		s.fail(w, r, http.StatusServiceUnavailable, "the alert could not be read: "+err.Error())
		return
	}
	v.Done = doneMessages[q.Get("done")]
	s.render(w, r, "alert", v)
}

// action runs one trust-and-safety action on the alert named by the form.
func (s *Server) action(w http.ResponseWriter, r *http.Request, name, done string, do func(a store.Alert, who store.Actor) (int, error)) {
	principal, sk := r.PostFormValue("p"), r.PostFormValue("k")
	a, ok := s.actionAlert(w, r, name, principal, sk)
	if !ok {
		return
	}
	who := s.actor(r)
	code, err := do(a, who)
	if err != nil {
		if code >= 500 {
			s.cfg.Log.Error("action failed", "action", name, "principal", principal, "actor", who.Name, "err", err, "correlation_id", who.CorrelationID)
		}
		s.refuse(w, r, name, code, err.Error(), func(msg string) { s.alertAgain(w, r, code, principal, sk, msg) })
		return
	}
	s.succeeded(w, r, name, who, map[string]any{"ok": true, "action": name, "principal": principal, "abuse_id": a.ID},
		"/alert?p="+url.QueryEscape(principal)+"&k="+url.QueryEscape(sk)+"&done="+done, "principal", principal, "abuse_id", a.ID)
}

// actionAlert reads the alert an action is on; when it cannot, it answers
// (404, or 503 when the store failed), counts the action and says false.
func (s *Server) actionAlert(w http.ResponseWriter, r *http.Request, action, principal, sk string) (store.Alert, bool) {
	a, err := s.cfg.Store.Get(r.Context(), principal, sk)
	if errors.Is(err, store.ErrNotFound) {
		s.metrics.actions.WithLabelValues(action, "not_found").Inc()
		s.fail(w, r, http.StatusNotFound, "no such alert")
		return a, false
	}
	if err != nil {
		s.metrics.actions.WithLabelValues(action, "error").Inc()
		s.fail(w, r, http.StatusServiceUnavailable, "the alert could not be read: "+err.Error())
		return a, false
	}
	return a, true
}

// alertAgain renders the alert page with msg first among its errors, after
// a refused action (the error page when the alert cannot be read).
func (s *Server) alertAgain(w http.ResponseWriter, r *http.Request, code int, principal, sk, msg string) {
	v, err := s.loadDetail(r, principal, sk)
	if err != nil {
		s.fail(w, r, code, msg)
		return
	}
	v.Errors = append([]string{msg}, v.Errors...)
	s.renderCode(w, r, code, "alert", v)
}

func actionCode(err error) int {
	switch {
	case errors.Is(err, store.ErrInvalid):
		return http.StatusUnprocessableEntity
	case errors.Is(err, store.ErrNoPenalty), errors.Is(err, store.ErrAlreadyMarked):
		return http.StatusConflict
	default:
		return http.StatusServiceUnavailable
	}
}

func (s *Server) lift(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, store.ActionLift, "lifted", func(a store.Alert, who store.Actor) (int, error) {
		_, err := s.cfg.Store.LiftPenalty(r.Context(), a, who)
		return actionCode(err), err
	})
}

// parseUntil reads "duration" (e.g. 6h, 7d) relative to now.
func parseUntil(now time.Time, v string) (time.Time, error) {
	v = strings.TrimSpace(v)
	if d, ok := strings.CutSuffix(v, "d"); ok {
		n, err := strconv.Atoi(d)
		if err != nil || n <= 0 || n > 365 {
			return time.Time{}, fmt.Errorf("%w: duration %q: days must be 1..365", store.ErrInvalid, v)
		}
		return now.Add(time.Duration(n) * 24 * time.Hour), nil
	}
	d, err := time.ParseDuration(v)
	if err != nil || d <= 0 {
		return time.Time{}, fmt.Errorf("%w: duration %q: want e.g. 30m, 6h or 7d", store.ErrInvalid, v)
	}
	return now.Add(d), nil
}

func (s *Server) extend(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, store.ActionExtend, "extended", func(a store.Alert, who store.Actor) (int, error) {
		cur, ok, err := s.cfg.Store.GetPenalty(r.Context(), a.Principal)
		if err != nil {
			return http.StatusServiceUnavailable, err
		}
		if !ok {
			return http.StatusConflict, store.ErrNoPenalty
		}
		base := cur.Until()
		until, err := parseUntil(base, r.PostFormValue("duration"))
		if err != nil {
			return http.StatusUnprocessableEntity, err
		}
		_, err = s.cfg.Store.ExtendPenalty(r.Context(), a, until, who)
		return actionCode(err), err
	})
}

func (s *Server) allowlist(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, store.ActionAllowlist, "allowlisted", func(a store.Alert, who store.Actor) (int, error) {
		until, err := parseUntil(s.cfg.Now(), r.PostFormValue("duration"))
		if err != nil {
			return http.StatusUnprocessableEntity, err
		}
		comment := strings.TrimSpace(r.PostFormValue("comment"))
		if len(comment) > store.MaxReason {
			return http.StatusUnprocessableEntity, fmt.Errorf("%w: the comment is longer than %d bytes", store.ErrInvalid, store.MaxReason)
		}
		_, err = s.cfg.Store.Allowlist(r.Context(), a, until, comment, who)
		return actionCode(err), err
	})
}
