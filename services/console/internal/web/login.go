package web

import (
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
)

func (s *Server) cookie(r *http.Request, name, value string, maxAge int) *http.Cookie {
	return &http.Cookie{Name: name, Value: value, Path: "/", MaxAge: maxAge, HttpOnly: true,
		Secure: s.cfg.SecureCookies || r.TLS != nil, SameSite: http.SameSiteLaxMode}
}

// safeNext keeps a post-sign-in target only when it is a path on this
// console: browsers drop tabs and newlines and read "\\" as "/", so
// "/%09/evil.example" or "/\\evil" would leave the site (issue 22 S12).
func safeNext(next string) string {
	const home = "/alerts"
	if len(next) > 2048 || !strings.HasPrefix(next, "/") {
		return home
	}
	for i := 0; i < len(next); i++ {
		if c := next[i]; c < 0x20 || c == 0x7f || c == '\\' {
			return home
		}
	}
	u, err := url.Parse(next)
	if err != nil || u.Scheme != "" || u.Host != "" || u.User != nil || strings.HasPrefix(next, "//") || !strings.HasPrefix(u.Path, "/") {
		return home
	}
	return next
}

func (s *Server) loginPage(w http.ResponseWriter, r *http.Request) {
	token, err := auth.RandomString(24)
	if err != nil {
		s.fail(w, r, http.StatusInternalServerError, "no randomness")
		return
	}
	http.SetCookie(w, s.cookie(r, LoginCookie, token, 600))
	s.render(w, r, "login", map[string]any{"Title": "Sign in", "LoginCSRF": token, "Next": safeNext(r.URL.Query().Get("next"))})
}

func (s *Server) login(w http.ResponseWriter, r *http.Request) {
	c, err := r.Cookie(LoginCookie)
	if err != nil || !auth.Equal(c.Value, r.PostFormValue("csrf")) {
		s.metrics.logins.WithLabelValues("csrf").Inc()
		s.fail(w, r, http.StatusForbidden, "the sign-in form has expired (CSRF check failed); reload it and try again")
		return
	}
	name := r.PostFormValue("username")
	att := s.attempt(r, name)
	lock, err := s.lockedOut(w, r.Context(), "password", att)
	if err != nil {
		s.cfg.Log.Error("check sign-in failures", "err", err)
		s.fail(w, r, http.StatusServiceUnavailable, "sign-in is unavailable (Redis); try again")
		return
	}
	if lock.Locked {
		s.metrics.logins.WithLabelValues("locked").Inc()
		w.WriteHeader(http.StatusTooManyRequests)
		token, _ := auth.RandomString(24)
		http.SetCookie(w, s.cookie(r, LoginCookie, token, 600))
		s.render(w, r, "login", map[string]any{"Title": "Sign in", "LoginCSRF": token, "Next": safeNext(r.PostFormValue("next")),
			"Error": lockoutMessage(lock), "Username": name})
		return
	}
	who, ok := s.cfg.Directory.Password(name, r.PostFormValue("password"))
	if !ok {
		s.metrics.logins.WithLabelValues("denied").Inc()
		s.failed(r.Context(), "password", att, httpapi.RequestID(r.Context()))
		s.cfg.Log.Warn("sign-in refused", "user", name, "remote", r.RemoteAddr)
		w.WriteHeader(http.StatusUnauthorized)
		token, _ := auth.RandomString(24)
		http.SetCookie(w, s.cookie(r, LoginCookie, token, 600))
		s.render(w, r, "login", map[string]any{"Title": "Sign in", "LoginCSRF": token, "Next": safeNext(r.PostFormValue("next")),
			"Error": "Wrong user name or password.", "Username": name})
		return
	}
	sess, err := s.cfg.Sessions.Create(r.Context(), who)
	if err != nil {
		s.cfg.Log.Error("create session", "err", err)
		s.fail(w, r, http.StatusServiceUnavailable, "sessions are unavailable; try again")
		return
	}
	if s.cfg.SignIn != nil {
		if err := s.cfg.SignIn.Succeed(r.Context(), att); err != nil {
			s.cfg.Log.Warn("clear sign-in failures", "user", name, "err", err)
		}
	}
	s.setDeviceCookie(w, r, name)
	s.metrics.logins.WithLabelValues("ok").Inc()
	s.cfg.Log.Info("signed in", "user", who.Name, "role", who.Role.String())
	http.SetCookie(w, s.cookie(r, SessionCookie, sess.ID, int(time.Until(sess.ExpiresAt).Seconds())))
	http.SetCookie(w, s.cookie(r, LoginCookie, "", -1))
	http.Redirect(w, r, safeNext(r.PostFormValue("next")), http.StatusSeeOther)
}

func (s *Server) logout(w http.ResponseWriter, r *http.Request) {
	if sess := current(r).sess; sess != nil {
		if err := s.cfg.Sessions.Delete(r.Context(), sess.ID); err != nil {
			s.cfg.Log.Error("delete session", "err", err)
		}
	}
	http.SetCookie(w, s.cookie(r, SessionCookie, "", -1))
	http.Redirect(w, r, "/login", http.StatusSeeOther)
}
