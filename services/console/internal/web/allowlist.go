package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/netip"
	"net/url"
	"strings"

	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// alertNetworks are the alert's top networks as the prefixes the detector
// stored them as (/24, /64): what the alert page offers to allowlist.
func alertNetworks(a store.Alert) []netip.Prefix {
	if a.Event == nil {
		return nil
	}
	var out []netip.Prefix
	seen := map[netip.Prefix]bool{}
	for _, ip := range a.Event.Evidence.TopIPs {
		addr := ip.IP.Unmap()
		bits := 64
		if addr.Is4() {
			bits = 24
		}
		p, err := addr.Prefix(bits)
		if err != nil || seen[p] {
			continue
		}
		seen[p] = true
		out = append(out, p)
	}
	return out
}

// loadCIDRAllow fills the alert's network allowlist state.
func (s *Server) loadCIDRAllow(ctx context.Context, v *detailView) error {
	nets := alertNetworks(v.Alert)
	if len(nets) == 0 {
		return nil
	}
	entries, err := s.cfg.Store.ListAllow(ctx)
	if err != nil {
		return err
	}
	v.CIDRAllow = map[string]store.AllowEntry{}
	for _, p := range nets {
		if e, ok := store.CIDRCovering(entries, p.Addr()); ok {
			v.CIDRAllow[p.Addr().String()] = e.AllowEntry
		}
	}
	for i := range v.IPs {
		if e, ok := v.CIDRAllow[v.IPs[i].IP]; ok {
			v.IPs[i].Allowed = &e
		}
	}
	for _, p := range nets {
		v.Networks = append(v.Networks, p.String())
	}
	return nil
}

type allowlistView struct {
	Title   string
	Entries []store.AllowListing
	CanAct  bool
	IsAdmin bool
	Done    string
	Errors  []string
	Form    struct{ CIDR, Comment, Duration string }
}

var allowDone = map[string]string{
	"added":   "Network allowlisted. The detector stops acting on detections whose every top address is in allowlisted networks from its next refresh (about 30 s).",
	"removed": "Allowlist entry removed. The detector acts on these detections again from its next refresh (about 30 s).",
}

func (s *Server) allowlistPage(w http.ResponseWriter, r *http.Request) {
	v := allowlistView{Title: "Allowlist", Done: allowDone[r.URL.Query().Get("done")]}
	s.renderAllowlist(w, r, http.StatusOK, v)
}

func (s *Server) renderAllowlist(w http.ResponseWriter, r *http.Request, code int, v allowlistView) {
	who := current(r).who
	v.Title, v.CanAct, v.IsAdmin = "Allowlist", who.Role.Allows(auth.RoleAnalyst), who.Role.Allows(auth.RoleAdmin)
	var err error
	if v.Entries, err = s.cfg.Store.ListAllow(r.Context()); err != nil {
		v.Errors = append(v.Errors, "The allowlist could not be read (DynamoDB): "+err.Error())
		if code < 500 {
			code = http.StatusServiceUnavailable
		}
	}
	w.WriteHeader(code)
	s.render(w, r, "allowlist", v)
}

// allowCIDR allowlists a network, from the allowlist page or (with p and k)
// from an alert's network evidence.
func (s *Server) allowCIDR(w http.ResponseWriter, r *http.Request) {
	const action = store.ActionAllowCIDR
	who := s.actor(r)
	var from *store.Alert
	if p, k := r.PostFormValue("p"), r.PostFormValue("k"); p != "" || k != "" {
		a, ok := s.actionAlert(w, r, action, p, k)
		if !ok {
			return
		}
		from = &a
	}
	refuse := func(code int, err error) {
		if code >= 500 {
			s.cfg.Log.Error("action failed", "action", action, "actor", who.Name, "err", err, "correlation_id", who.CorrelationID)
		}
		s.refuse(w, r, action, code, err.Error(), func(msg string) {
			if from != nil {
				s.alertAgain(w, r, code, from.Principal, from.SK, msg)
				return
			}
			v := allowlistView{Errors: []string{msg}}
			v.Form.CIDR, v.Form.Comment, v.Form.Duration = r.PostFormValue("cidr"), r.PostFormValue("comment"), r.PostFormValue("duration")
			s.renderAllowlist(w, r, code, v)
		})
	}
	prefix, err := store.ParseCIDR(r.PostFormValue("cidr"), current(r).who.Role.Allows(auth.RoleAdmin))
	switch {
	case errors.Is(err, store.ErrBroad):
		refuse(http.StatusForbidden, err)
		return
	case err != nil:
		refuse(http.StatusUnprocessableEntity, err)
		return
	}
	until, err := parseUntil(s.cfg.Now(), r.PostFormValue("duration"))
	if err != nil {
		refuse(http.StatusUnprocessableEntity, err)
		return
	}
	e, err := s.cfg.Store.AllowCIDR(r.Context(), prefix, until, strings.TrimSpace(r.PostFormValue("comment")), who, from)
	if err != nil {
		refuse(actionCode(err), err)
		return
	}
	next := "/allowlist?done=added"
	if from != nil {
		next = "/alert?p=" + url.QueryEscape(from.Principal) + "&k=" + url.QueryEscape(from.SK) + "&done=cidr_allowlisted"
	}
	s.succeeded(w, r, action, who, map[string]any{"ok": true, "action": action, "cidr": prefix.String(), "expires_at": e.ExpiresAt},
		next, "cidr", prefix.String())
}

// removeAllow deletes a principal's or a network's allowlist entry.
func (s *Server) removeAllow(w http.ResponseWriter, r *http.Request) {
	const action = store.ActionAllowRemove
	who := s.actor(r)
	pk := r.PostFormValue("pk")
	prev, err := s.cfg.Store.RemoveAllow(r.Context(), pk, who)
	if err != nil {
		code := actionCode(err)
		if errors.Is(err, store.ErrNoAllow) {
			code = http.StatusNotFound
		}
		if code >= 500 {
			s.cfg.Log.Error("action failed", "action", action, "pk", pk, "actor", who.Name, "err", err, "correlation_id", who.CorrelationID)
		}
		s.refuse(w, r, action, code, err.Error(), func(string) {
			s.renderAllowlist(w, r, code, allowlistView{Errors: []string{fmt.Sprintf("%s: %v", strings.TrimPrefix(pk, store.AllowPrefix), err)}})
		})
		return
	}
	s.succeeded(w, r, action, who, map[string]any{"ok": true, "action": action, "pk": prev.PK}, "/allowlist?done=removed", "pk", prev.PK)
}
