// Package web serves the console: server-rendered pages (html/template, assets
// embedded), sign-in with sessions and CSRF tokens, API tokens, role checks
// and the trust-and-safety actions.
package web

import (
	"context"
	"embed"
	"encoding/json"
	"errors"
	"fmt"
	"html/template"
	"io/fs"
	"log/slog"
	"math"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/blockrate"
	"github.com/floodgate-dev/floodgate/services/console/internal/dlq"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

//go:embed templates/*.html
var templateFS embed.FS

//go:embed static
var staticFS embed.FS

// SessionCookie names the session cookie; LoginCookie the pre-session CSRF cookie.
const (
	SessionCookie = "fgc_session"
	LoginCookie   = "fgc_login"
)

// Config wires a Server.
type Config struct {
	Directory     auth.Users
	Sessions      *auth.Sessions
	Store         *store.Store
	Log           *slog.Logger
	Registry      prometheus.Registerer
	Now           func() time.Time
	SecureCookies bool                   // Secure flag on cookies (always set when the request came over TLS)
	PollInterval  time.Duration          // how often the alerts page asks for new alerts
	ScalesKey     string                 // fg:scales
	Quota         *quota.Client          // the quota service's usage API (nil: the principal page says it is not configured)
	Adjuster      *adjuster.Client       // the adjuster's admin API (nil: the page says it is not configured)
	DLQ           *dlq.Client            // the dlq-auditor's API (nil: the page says it is not configured)
	BlockRate     *blockrate.Reader      // limiter_decisions in InfluxDB (nil: the page says it is not configured)
	ScaleSeries   *adjuster.Series       // adjuster_scales in InfluxDB (nil: the scales page has no history chart)
	Adjustments   *adjuster.Adjustments  // adjustment.v1 events on Kafka (nil: the scales page lists no changes)
	OverridesKey  string                 // the limiter's overrides hash (default limiter.OverridesKey)
	Samples       SampleSource           // decision events around a detection, from Kafka (nil: the alert page says it is not configured)
	SignIn        *auth.Limiter          // sign-in and API-token failure limits in Redis (nil: no limit)
	Devices       *auth.DeviceCookies    // device cookies: known browsers are never locked out by others' failures (nil: none)
	Rollouts      *Rollouts              // the rules topic of rule rollouts (nil: the page says it is not configured)
	Proxies       gateway.TrustedProxies // whose X-Forwarded-For names the client for the failure limits
	WhatIf        *WhatIf                // what-if replays of the decisions topic (nil: the page says it is not configured)
	Deferred      *deferred.Store        // deferred-work queues in Redis (nil: the page says it is not configured)
}

// Server is the console's HTTP handler.
type Server struct {
	cfg     Config
	pages   map[string]*template.Template
	mux     *httpapi.Mux
	metrics metrics
	signIn  signInMetrics
}

// metrics are the console's own; its request metrics
// (floodgate_console_requests_total{route,code}) come from pkg/httpapi.
type metrics struct {
	actions *prometheus.CounterVec
	logins  *prometheus.CounterVec
}

// New builds the handler.
func New(cfg Config) (*Server, error) {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.PollInterval <= 0 {
		cfg.PollInterval = 5 * time.Second
	}
	if cfg.ScalesKey == "" {
		cfg.ScalesKey = "fg:scales"
	}
	s := &Server{cfg: cfg, pages: map[string]*template.Template{}, mux: httpapi.NewMux()}
	f := promauto.With(cfg.Registry)
	s.metrics = metrics{
		actions: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_console_actions_total", Help: "Trust-and-safety actions by action and outcome."}, []string{"action", "outcome"}),
		logins:  f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_console_logins_total", Help: "Sign-in attempts by outcome."}, []string{"outcome"}),
	}
	s.signIn = newSignInMetrics(f)
	funcs := template.FuncMap{
		"ts":    func(t time.Time) string { return fmtTime(t) },
		"tsms":  func(ms int64) string { return fmtTime(time.UnixMilli(ms)) },
		"tssec": func(s int64) string { return fmtTime(time.Unix(s, 0)) },
		"rate":  func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) },
		"num":   func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) },
		"q":     url.QueryEscape,
		"can":   func(r auth.Role, need string) bool { n, _ := auth.ParseRole(need); return r.Allows(n) },
		"plink": func(key string) string {
			kind, id, _ := strings.Cut(key, ":")
			return "/principals/" + url.PathEscape(kind) + "/" + url.PathEscape(id)
		},
		"pct":      func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + " %" },
		"statusfr": func(s string) string { return strings.ReplaceAll(s, "_", " ") },
		"tsmilli":  func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
		"cidrof":   func(pk string) string { return strings.TrimPrefix(pk, store.AllowCIDRPrefix) },
		"dims":     whatIfDims,
	}
	for _, page := range []string{"login", "alerts", "alert", "rows", "scales", "fps", "error", "principal", "adjuster", "dlq", "dlqrecord", "blockrate", "overrides", "dlqpurge", "allowlist", "whatif", "rollouts", "deferred"} {
		files := []string{"templates/layout.html", "templates/" + page + ".html"}
		if page == "alerts" {
			files = append(files, "templates/rows.html")
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, files...)
		if err != nil {
			return nil, fmt.Errorf("parse template %s: %w", page, err)
		}
		s.pages[page] = t
	}
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return nil, fmt.Errorf("static assets: %w", err)
	}
	s.route("GET /static/", http.StripPrefix("/static/", http.FileServerFS(static)).ServeHTTP)
	s.route("GET /healthz", func(w http.ResponseWriter, r *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	s.route("GET /login", s.loginPage)
	s.route("POST /login", s.login)
	s.route("POST /logout", s.authed(auth.RoleViewer, s.logout))
	s.route("GET /{$}", func(w http.ResponseWriter, r *http.Request) { http.Redirect(w, r, "/alerts", http.StatusSeeOther) })
	s.route("GET /alerts", s.authed(auth.RoleViewer, s.alerts))
	s.route("GET /alerts/new", s.authed(auth.RoleViewer, s.newAlerts))
	s.route("GET /alert", s.authed(auth.RoleViewer, s.alert))
	s.route("POST /alert/lift", s.authed(auth.RoleAnalyst, s.lift))
	s.route("POST /alert/extend", s.authed(auth.RoleAnalyst, s.extend))
	s.route("POST /alert/allowlist", s.authed(auth.RoleAnalyst, s.allowlist))
	s.route("POST /alert/false-positive", s.authed(auth.RoleAnalyst, s.falsePositive))
	s.route("GET /principals/{kind}/{id}", s.authed(auth.RoleViewer, s.principal))
	s.route("GET /sre/adjuster", s.authed(auth.RoleViewer, s.adjusterPage))
	s.route("POST /sre/adjuster/mode", s.authed(auth.RoleSRE, s.adjusterMode))
	s.route("POST /sre/adjuster/rules", s.authed(auth.RoleSRE, s.adjusterRules))
	s.route("GET /sre/dlq", s.authed(auth.RoleViewer, s.dlqPage))
	s.route("GET /sre/dlq/record", s.authed(auth.RoleViewer, s.dlqRecord))
	s.route("POST /sre/dlq/replay", s.authed(auth.RoleSRE, s.dlqReplay))
	s.route("POST /sre/dlq/purge", s.authed(auth.RoleSRE, s.dlqPurge))
	s.route("GET /sre/overrides", s.authed(auth.RoleViewer, s.overridesPage))
	s.route("POST /sre/overrides", s.authed(auth.RoleSRE, s.overrideSave))
	s.route("POST /sre/overrides/delete", s.authed(auth.RoleSRE, s.overrideDelete))
	s.route("GET /sre/rollouts", s.authed(auth.RoleViewer, s.rolloutsPage))
	s.route("POST /sre/rollouts", s.authed(auth.RoleSRE, s.rolloutStart))
	s.route("POST /sre/rollouts/promote", s.authed(auth.RoleSRE, s.rolloutPromote))
	s.route("POST /sre/rollouts/abort", s.authed(auth.RoleSRE, s.rolloutAbort))
	s.route("POST /sre/rollouts/rollback", s.authed(auth.RoleSRE, s.rolloutRollback))
	s.route("GET /sre/deferred", s.authed(auth.RoleViewer, s.deferredPage))
	s.route("POST /sre/deferred", s.authed(auth.RoleSRE, s.deferredAction))
	s.route("GET /sre/block-rate", s.authed(auth.RoleViewer, s.blockRate))
	s.route("GET /sre/whatif", s.authed(auth.RoleViewer, s.whatIfPage))
	s.route("POST /sre/whatif", s.authed(auth.RoleSRE, s.whatIfRun))
	s.route("GET /scales", s.authed(auth.RoleViewer, s.scales))
	s.route("GET /false-positives", s.authed(auth.RoleViewer, s.fps))
	s.route("GET /api/v1/alerts", s.authed(auth.RoleViewer, s.apiAlerts))
	s.route("GET /allowlist", s.authed(auth.RoleViewer, s.allowlistPage))
	s.route("POST /allowlist/cidr", s.authed(auth.RoleAnalyst, s.allowCIDR))
	s.route("POST /allowlist/remove", s.authed(auth.RoleAnalyst, s.removeAllow))
	return s, nil
}

func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}

// ServeHTTP adds security headers and a correlation id to every response
// (the one httpapi.Middleware put in the context, else the caller's
// X-Request-Id or a new one).
func (s *Server) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if httpapi.RequestID(r.Context()) == "" {
		id := httpapi.RequestIDFrom(r)
		w.Header().Set(httpapi.HeaderRequestID, id)
		r = r.WithContext(httpapi.WithRequestID(r.Context(), id))
	}
	h := w.Header()
	h.Set("Content-Security-Policy", "default-src 'self'; img-src 'self' data:; style-src 'self'; script-src 'self'; frame-ancestors 'none'; form-action 'self'; base-uri 'none'")
	h.Set("X-Content-Type-Options", "nosniff")
	h.Set("X-Frame-Options", "DENY")
	h.Set("Referrer-Policy", "same-origin")
	h.Set("Cache-Control", "no-store")
	s.mux.ServeHTTP(w, r)
}

func (s *Server) route(pattern string, h http.HandlerFunc) { s.mux.HandleFunc(pattern, h) }

// Routes lists the patterns served (the OpenAPI drift test compares them
// with schemas/openapi/console.yaml).
func (s *Server) Routes() []string { return s.mux.Routes() }

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
			// The role is the users file's, read now: a removed user or a
			// changed role takes effect on the next request.
			who, ok := s.cfg.Directory.User(sess.Identity.Name)
			if !ok {
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

func wantsJSON(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/api/") || auth.BearerToken(r.Header.Get("Authorization")) != "" ||
		strings.Contains(r.Header.Get("Accept"), "application/json")
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if wantsJSON(r) { // an RFC 9457 problem
		httpapi.WriteProblem(w, r, httpapi.Problem{Type: problemType(code), Status: code, Detail: msg})
		return
	}
	w.WriteHeader(code)
	s.render(w, r, "error", map[string]any{"Title": http.StatusText(code), "Code": code, "Message": msg})
}

// problemType is the problem type of a console API refusal.
func problemType(code int) string {
	switch code {
	case http.StatusBadRequest:
		return httpapi.ProblemInvalidRequest
	case http.StatusUnauthorized:
		return httpapi.ProblemUnauthenticated
	case http.StatusForbidden:
		return httpapi.ProblemForbidden
	case http.StatusNotFound:
		return httpapi.ProblemNotFound
	case http.StatusConflict:
		return httpapi.ProblemConflict
	case http.StatusUnprocessableEntity:
		return httpapi.ProblemUnprocessable
	case http.StatusTooManyRequests:
		return httpapi.ProblemTooManyRequests
	case http.StatusBadGateway:
		return httpapi.ProblemBadGateway
	case http.StatusServiceUnavailable:
		return httpapi.ProblemUnavailable
	}
	if code >= 500 {
		return httpapi.ProblemInternal
	}
	return "about:blank"
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type page struct {
	Title string
	Who   auth.Identity
	CSRF  string
	Nav   string
	Data  any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, data any) {
	req := current(r)
	p := page{Who: req.who, Nav: name, Data: data}
	if req.sess != nil {
		p.CSRF = req.sess.CSRF
	}
	if m, ok := data.(map[string]any); ok {
		p.Title, _ = m["Title"].(string)
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
	}
	tmpl := "layout.html"
	if name == "rows" {
		tmpl = "rows"
	}
	if err := s.pages[name].ExecuteTemplate(w, tmpl, p); err != nil {
		s.cfg.Log.Error("render page", "page", name, "err", err)
	}
}

// --- sign-in ---

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

// --- alerts ---

var (
	patterns   = []string{string(events.PatternRapidFire), string(events.PatternDistributedIP), string(events.PatternBotLike), string(events.PatternCredentialStuffing), string(events.PatternScraping)}
	severities = []string{string(events.SeverityLow), string(events.SeverityMedium), string(events.SeverityHigh), string(events.SeverityCritical)}
	windows    = []struct{ Value, Label string }{{"1h", "last hour"}, {"24h", "last 24 hours"}, {"168h", "last 7 days"}, {"720h", "last 30 days"}}
)

func oneOf(v string, allowed []string) bool {
	for _, a := range allowed {
		if a == v {
			return true
		}
	}
	return false
}

type listView struct {
	Title             string
	Pattern, Severity string
	Status, Window    string
	Patterns          []string
	Severities        []string
	Statuses          []string
	Windows           []struct{ Value, Label string }
	Alerts            []store.Alert
	Next              string
	Query             template.URL
	First             bool
	Latest            string
	PollMS            int64
	Error             string
	CanAct            bool
}

func (s *Server) filter(r *http.Request) (store.Filter, listView, error) {
	q := r.URL.Query()
	v := listView{Title: "Alerts", Pattern: q.Get("pattern"), Severity: q.Get("severity"), Status: q.Get("status"), Window: q.Get("window"),
		Patterns: patterns, Severities: severities, Statuses: store.Statuses, Windows: windows, First: q.Get("cursor") == "",
		PollMS: s.cfg.PollInterval.Milliseconds()}
	if v.Window == "" {
		v.Window = "168h"
	}
	var errs []string
	if v.Pattern != "" && !oneOf(v.Pattern, patterns) {
		errs = append(errs, "pattern must be one of "+strings.Join(patterns, ", "))
	}
	if v.Severity != "" && !oneOf(v.Severity, severities) {
		errs = append(errs, "severity must be one of "+strings.Join(severities, ", "))
	}
	if v.Status != "" && !oneOf(v.Status, store.Statuses) {
		errs = append(errs, "status must be one of "+strings.Join(store.Statuses, ", "))
	}
	win, err := time.ParseDuration(v.Window)
	if err != nil || win <= 0 || win > store.MaxDays*24*time.Hour {
		errs = append(errs, "window must be a duration up to 744h")
		win = 168 * time.Hour
	}
	now := s.cfg.Now()
	f := store.Filter{Pattern: v.Pattern, Severity: v.Severity, Status: v.Status, Since: now.Add(-win), Until: now,
		PageSize: 25, Cursor: q.Get("cursor")}
	if n, err := strconv.Atoi(q.Get("limit")); err == nil && n >= 1 && n <= 200 {
		f.PageSize = n
	}
	keep := url.Values{}
	for _, k := range []string{"pattern", "severity", "status", "window"} {
		if q.Get(k) != "" {
			keep.Set(k, q.Get(k))
		}
	}
	v.Query = template.URL(keep.Encode()) // #nosec: built by url.Values.Encode
	if len(errs) > 0 {
		return f, v, errors.New(strings.Join(errs, "; "))
	}
	return f, v, nil
}

func (s *Server) alerts(w http.ResponseWriter, r *http.Request) {
	f, v, err := s.filter(r)
	v.CanAct = current(r).who.Role.Allows(auth.RoleAnalyst)
	if err != nil {
		w.WriteHeader(http.StatusBadRequest)
		v.Error = err.Error()
		s.render(w, r, "alerts", v)
		return
	}
	v.Alerts, v.Next, err = s.cfg.Store.List(r.Context(), f)
	switch {
	case errors.Is(err, store.ErrBadCursor):
		w.WriteHeader(http.StatusBadRequest)
		v.Error = "That page link is not valid any more; start from the first page."
	case err != nil:
		s.cfg.Log.Error("list alerts", "err", err)
		w.WriteHeader(http.StatusServiceUnavailable)
		v.Error = "The abuse records could not be read (DynamoDB): " + err.Error()
	}
	// New alerts are polled from the newest one shown (or five minutes back).
	v.Latest = s.cfg.Now().UTC().Add(-5 * time.Minute).Format("2006-01-02T15:04:05.000Z")
	if len(v.Alerts) > 0 && v.Alerts[0].GSI1SK > v.Latest {
		v.Latest = v.Alerts[0].GSI1SK
	}
	s.render(w, r, "alerts", v)
}

// newAlerts answers the alerts page's polling: rows newer than after, as an
// HTML fragment, with the newest one's key in X-Latest.
func (s *Server) newAlerts(w http.ResponseWriter, r *http.Request) {
	f, v, err := s.filter(r)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	after := r.URL.Query().Get("after")
	if _, err := time.Parse("2006-01-02T15:04:05.000Z", after); err != nil {
		s.fail(w, r, http.StatusBadRequest, "after must be a detected_at key (2006-01-02T15:04:05.000Z)")
		return
	}
	f.After, f.Cursor, f.PageSize = after, "", 50
	at, _ := time.Parse("2006-01-02T15:04:05.000Z", after)
	f.Since = at
	v.Alerts, _, err = s.cfg.Store.List(r.Context(), f)
	if err != nil {
		s.cfg.Log.Error("poll alerts", "err", err)
		s.fail(w, r, http.StatusServiceUnavailable, "abuse records unavailable")
		return
	}
	latest := after
	for _, a := range v.Alerts {
		if a.GSI1SK > latest {
			latest = a.GSI1SK
		}
	}
	w.Header().Set("X-Latest", latest)
	w.Header().Set("X-New-Count", strconv.Itoa(len(v.Alerts)))
	s.render(w, r, "rows", v)
}

func (s *Server) apiAlerts(w http.ResponseWriter, r *http.Request) {
	f, _, err := s.filter(r)
	if err != nil {
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	list, next, err := s.cfg.Store.List(r.Context(), f)
	if errors.Is(err, store.ErrBadCursor) {
		s.fail(w, r, http.StatusBadRequest, "bad cursor")
		return
	}
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, "abuse records unavailable")
		return
	}
	type item struct {
		ID         string    `json:"id"`
		Principal  string    `json:"principal"`
		Key        string    `json:"key"`
		Pattern    string    `json:"pattern"`
		Severity   string    `json:"severity"`
		Score      float64   `json:"score"`
		Status     string    `json:"status"`
		DetectedAt time.Time `json:"detected_at"`
	}
	out := make([]item, 0, len(list))
	for _, a := range list {
		out = append(out, item{a.ID, a.Principal, a.SK, a.Pattern, a.Severity, a.Score, a.Status, a.DetectedAt})
	}
	writeJSON(w, http.StatusOK, map[string]any{"alerts": out, "next": next})
}

type ipView struct {
	IP      string
	Count   int64
	Shared  int64
	IsNAT   bool
	Allowed *store.AllowEntry // the network allowlist entry covering it
}

type detailView struct {
	Title      string
	Alert      store.Alert
	Ev         *events.Abuse
	IPs        []ipView
	Penalty    store.Penalty
	HasPenalty bool
	Allow      store.AllowEntry
	Allowed    bool
	History    []store.Alert
	Audit      []store.AuditEntry
	Chart      template.HTML
	ChartNote  string // what the chart compares
	Samples    samplesView
	CIDRAllow  map[string]store.AllowEntry // the alert's networks (address) → the CIDR entry covering it
	Networks   []string                    // the alert's networks as prefixes, to allowlist
	CanAct     bool
	IsAdmin    bool
	Done       string
	Errors     []string
	Version    string
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
	if v.Penalty, v.HasPenalty, err = s.cfg.Store.GetPenalty(ctx, principal); err != nil {
		errs = append(errs, "live penalty unavailable (Redis): "+err.Error())
	}
	if v.Allow, v.Allowed, err = s.cfg.Store.GetAllow(ctx, principal); err != nil {
		errs = append(errs, "allowlist unavailable: "+err.Error())
	}
	if v.History, err = s.cfg.Store.History(ctx, principal, 20); err != nil {
		errs = append(errs, "history unavailable: "+err.Error())
	}
	if v.Audit, err = s.cfg.Store.AuditLog(ctx, principal, 20); err != nil {
		errs = append(errs, "audit log unavailable: "+err.Error())
	}
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
	req := current(r)
	principal, sk := r.PostFormValue("p"), r.PostFormValue("k")
	a, err := s.cfg.Store.Get(r.Context(), principal, sk)
	if errors.Is(err, store.ErrNotFound) {
		s.metrics.actions.WithLabelValues(name, "not_found").Inc()
		s.fail(w, r, http.StatusNotFound, "no such alert")
		return
	}
	if err != nil {
		s.metrics.actions.WithLabelValues(name, "error").Inc()
		s.fail(w, r, http.StatusServiceUnavailable, "the alert could not be read: "+err.Error())
		return
	}
	who := store.Actor{Name: req.who.Name, Role: req.who.Role.String(), Reason: strings.TrimSpace(r.PostFormValue("reason")), CorrelationID: req.corr}
	code, err := do(a, who)
	if err != nil {
		outcome := "error"
		if code < 500 {
			outcome = "refused"
		}
		s.metrics.actions.WithLabelValues(name, outcome).Inc()
		if code >= 500 {
			s.cfg.Log.Error("action failed", "action", name, "principal", principal, "actor", who.Name, "err", err, "correlation_id", req.corr)
		}
		if wantsJSON(r) {
			s.fail(w, r, code, err.Error())
			return
		}
		v, lerr := s.loadDetail(r, principal, sk)
		if lerr != nil {
			s.fail(w, r, code, err.Error())
			return
		}
		v.Errors = append([]string{err.Error()}, v.Errors...)
		w.WriteHeader(code)
		s.render(w, r, "alert", v)
		return
	}
	s.metrics.actions.WithLabelValues(name, "ok").Inc()
	s.cfg.Log.Info("action", "action", name, "principal", principal, "abuse_id", a.ID, "actor", who.Name, "reason", who.Reason, "correlation_id", req.corr)
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, map[string]any{"ok": true, "action": name, "principal": principal, "abuse_id": a.ID})
		return
	}
	http.Redirect(w, r, "/alert?p="+url.QueryEscape(principal)+"&k="+url.QueryEscape(sk)+"&done="+done, http.StatusSeeOther)
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

func (s *Server) falsePositive(w http.ResponseWriter, r *http.Request) {
	s.action(w, r, store.ActionFalsePositive, "false_positive", func(a store.Alert, who store.Actor) (int, error) {
		version := "unknown"
		if a.Event != nil && a.Event.DetectorVersion != "" {
			version = a.Event.DetectorVersion
		}
		err := s.cfg.Store.MarkFalsePositive(r.Context(), a, version, who)
		return actionCode(err), err
	})
}

// --- SRE pages ---

type fpView struct {
	Title  string
	Counts []store.FalsePositiveCount
	Error  string
}

func (s *Server) fps(w http.ResponseWriter, r *http.Request) {
	v := fpView{Title: "False positives"}
	var err error
	if v.Counts, err = s.cfg.Store.FalsePositives(r.Context()); err != nil {
		w.WriteHeader(http.StatusServiceUnavailable)
		v.Error = "False-positive counts could not be read: " + err.Error()
	}
	s.render(w, r, "fps", v)
}

// --- server-rendered SVG ---

// evidenceChart draws what a pattern compares: for distributed_ip distinct
// networks against the count that fires (a rate means nothing there), for
// the rate patterns the observed rate against the expected one and the line.
func evidenceChart(a *events.Abuse) (template.HTML, string) {
	e := a.Evidence
	if a.Pattern == events.PatternDistributedIP {
		bars := []chartBar{{"addresses", float64(e.DistinctIPs), "bar-observed"}, {"/24 + /64", float64(e.DistinctIP24 + e.DistinctIP64), "bar-observed"}}
		note := "Distinct client addresses and networks in the window"
		if b := e.Basis; b != nil {
			if b.NewNetworks > 0 {
				bars = append(bars, chartBar{"new nets", float64(b.NewNetworks), "bar-observed"})
				note += ", networks new to the principal within seconds (fan-out)"
			}
			bars = append(bars, chartBar{"threshold", float64(b.NetworkThreshold), "bar-threshold"})
			note += ", against the count of unshared networks that fires"
		}
		return barChart(bars, ""), note + "."
	}
	note := "Observed rate against the expected (baseline) rate and the firing threshold, events per second."
	if b := e.Basis; b != nil && b.Source == events.BasisLimit {
		note = fmt.Sprintf("Automation is measured against its limit: observed rate, the rate the limiter let through, and the line (%.0f %% of requests denied).", 100*b.DenialRatio)
	}
	return rateChart(e), note
}

type chartBar struct {
	label string
	v     float64
	class string
}

// barChart draws labelled horizontal bars; unit follows each value.
func barChart(bars []chartBar, unit string) template.HTML {
	maxV := 0.0
	for _, b := range bars {
		maxV = math.Max(maxV, b.v)
	}
	if maxV <= 0 {
		maxV = 1
	}
	var sb strings.Builder
	label := make([]string, len(bars))
	for i, b := range bars {
		label[i] = fmt.Sprintf("%s %.2f%s", b.label, b.v, unit)
	}
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 420 %d" role="img" aria-label="%s">`, 10+30*len(bars), template.HTMLEscapeString(strings.Join(label, ", ")))
	for i, b := range bars {
		y := 8 + i*30
		wd := 260 * b.v / maxV
		fmt.Fprintf(&sb, `<text x="0" y="%d" class="chart-label">%s</text><rect x="80" y="%d" width="%.1f" height="20" class="%s"/><text x="%.1f" y="%d" class="chart-value">%s%s</text>`,
			y+15, b.label, y, math.Max(wd, 1), b.class, 86+wd, y+15, strconv.FormatFloat(b.v, 'f', -1, 64), unit)
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String()) //nolint:gosec // built from numbers and fixed labels only
}

// rateChart compares the observed rate with the expected rate and the threshold.
func rateChart(e events.Evidence) template.HTML {
	bars := []struct {
		label string
		v     float64
		class string
	}{{"observed", e.ObservedRate, "bar-observed"}, {"expected", e.BaselineRate, "bar-expected"}, {"threshold", e.Threshold, "bar-threshold"}}
	maxV := 0.0
	for _, b := range bars {
		maxV = math.Max(maxV, b.v)
	}
	if maxV <= 0 {
		maxV = 1
	}
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 420 100" role="img" aria-label="observed %.2f/s, expected %.2f/s, threshold %.2f/s">`, e.ObservedRate, e.BaselineRate, e.Threshold)
	for i, b := range bars {
		y := 8 + i*30
		wd := 260 * b.v / maxV
		fmt.Fprintf(&sb, `<text x="0" y="%d" class="chart-label">%s</text><rect x="80" y="%d" width="%.1f" height="20" class="%s"/><text x="%.1f" y="%d" class="chart-value">%.2f/s</text>`,
			y+15, b.label, y, math.Max(wd, 1), b.class, 86+wd, y+15, b.v)
	}
	sb.WriteString(`</svg>`)
	return template.HTML(sb.String()) //nolint:gosec // built from numbers and fixed labels only
}

// scaleBars draws each scope's scale on a 0..1 axis (values above 1 run off the axis' end).
func scaleBars(scales []store.Scale) template.HTML {
	if len(scales) == 0 {
		return ""
	}
	h := 30*len(scales) + 10
	var sb strings.Builder
	fmt.Fprintf(&sb, `<svg class="chart" viewBox="0 0 460 %d" role="img" aria-label="limit scales">`, h)
	for i, sc := range scales {
		y := 5 + i*30
		wd := 300 * math.Min(sc.Value, 1.2)
		fmt.Fprintf(&sb, `<text x="0" y="%d" class="chart-label">%s</text><rect x="110" y="%d" width="%.1f" height="20" class="bar-scale"/><text x="%.1f" y="%d" class="chart-value">%s</text>`,
			y+15, template.HTMLEscapeString(sc.Scope), y, math.Max(wd, 1), 116+wd, y+15, strconv.FormatFloat(sc.Value, 'f', -1, 64))
	}
	fmt.Fprintf(&sb, `<line x1="410" x2="410" y1="0" y2="%d" class="axis-one"/></svg>`, h)
	return template.HTML(sb.String()) //nolint:gosec // scopes are escaped
}
