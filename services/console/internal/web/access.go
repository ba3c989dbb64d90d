package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strings"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
)

type request struct {
	who  auth.Identity
	sess *auth.Session
	corr string
}

type ctxKey struct{}

func current(r *http.Request) request {
	v, _ := r.Context().Value(ctxKey{}).(request)
	return v
}

// editState is the part of an SRE page's view that says whether its forms
// are shown (CanEdit: to SREs, while what they change can be read) and what
// went wrong (Errors).
type editState struct {
	CanEdit bool
	Errors  []string
}

// editStateFor starts the editState of a page r asks for: the forms are
// shown when r's user is an SRE.
func editStateFor(r *http.Request) editState {
	return editState{CanEdit: current(r).who.Role.Allows(auth.RoleSRE)}
}

// readOnly shows msg and hides the forms: what they change is not
// configured or could not be read.
func (e *editState) readOnly(msg string) {
	e.Errors = append(e.Errors, msg)
	e.CanEdit = false
}

// authed resolves the caller (a bearer token, else the session cookie), checks
// its role and, for a session's POST, its CSRF token.
func (s *Server) authed(need auth.Role, h http.HandlerFunc) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		req := request{corr: httpapi.RequestID(r.Context())}
		if tok := auth.BearerToken(r.Header.Get("Authorization")); tok != "" {
			att := auth.Attempt{IP: s.clientIP(r)}
			lock, err := s.lockedOut(w, r.Context(), "token", att)
			if err != nil { // tokens are 256-bit: fail open rather than lock every token out
				s.cfg.Log.Error("check token failures", "err", err, "correlation_id", req.corr)
			}
			if lock.Locked {
				s.fail(w, r, http.StatusTooManyRequests, "too many failed API-token authentications from your address; retry after "+w.Header().Get("Retry-After")+" s")
				return
			}
			id, ok := s.cfg.Directory.Token(tok)
			if !ok {
				s.failed(r.Context(), "token", att, req.corr)
				s.fail(w, r, http.StatusUnauthorized, "unknown API token")
				return
			}
			req.who = id
		} else {
			c, err := r.Cookie(SessionCookie)
			if err != nil {
				s.toLogin(w, r)
				return
			}
			sess, err := s.cfg.Sessions.Get(r.Context(), c.Value)
			if errors.Is(err, auth.ErrNoSession) {
				s.toLogin(w, r)
				return
			}
			if err != nil {
				s.cfg.Log.Error("read session", "err", err, "correlation_id", req.corr)
				s.fail(w, r, http.StatusServiceUnavailable, "sessions are unavailable; try again")
				return
			}
			// The role is the users file's, read now. A removed user, or a
			// new password or role (another credential generation), ends
			// every session the user had: each is refused on its next use.
			who, ok := s.cfg.Directory.User(sess.Identity.Name)
			if !ok || !auth.Equal(who.Generation, sess.Identity.Generation) {
				_ = s.cfg.Sessions.Delete(r.Context(), c.Value)
				s.toLogin(w, r)
				return
			}
			req.who, req.sess = who, &sess
			if r.Method == http.MethodPost && !auth.Equal(r.PostFormValue("csrf"), sess.CSRF) {
				s.fail(w, r, http.StatusForbidden, "the form has expired or did not come from this console (CSRF check failed); reload the page and try again")
				return
			}
		}
		if !req.who.Role.Allows(need) {
			s.fail(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, req)), http.StatusForbidden,
				fmt.Sprintf("%s needs the %s role; you are %s", r.URL.Path, need, req.who.Role))
			return
		}
		h(w, r.WithContext(context.WithValue(r.Context(), ctxKey{}, req)))
	}
}

func (s *Server) toLogin(w http.ResponseWriter, r *http.Request) {
	if r.Method != http.MethodGet || strings.HasPrefix(r.URL.Path, "/api/") || r.URL.Path == "/alerts/new" {
		s.fail(w, r, http.StatusUnauthorized, "sign in first")
		return
	}
	http.Redirect(w, r, "/login?next="+url.QueryEscape(r.URL.RequestURI()), http.StatusSeeOther)
}
