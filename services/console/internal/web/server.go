// Package web serves the console: server-rendered pages (html/template, assets
// embedded), sign-in with sessions and CSRF tokens, API tokens, role checks
// and the trust-and-safety actions.
package web

import (
	"html/template"
	"log/slog"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/precision"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/blockrate"
	"github.com/floodgate-dev/floodgate/services/console/internal/dlq"
	"github.com/floodgate-dev/floodgate/services/console/internal/quota"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

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
	Proposals     *Proposals             // tuning proposals and the detector parameters topic (nil: the page says it is not configured)
	Proxies       gateway.TrustedProxies // whose X-Forwarded-For names the client for the failure limits
	WhatIf        *WhatIf                // what-if replays of the decisions topic (nil: the page says it is not configured)
	Deferred      *deferred.Store        // deferred-work queues in Redis (nil: the page says it is not configured)
	Verdicts      VerdictPublisher       // verdict.v1 events (nil: verdicts are stored, not published)
	Networks      precision.Classifier   // network classes of detections, for precision
	Precision     PrecisionConfig        // the precision page, metrics and thresholds
}

// Server is the console's HTTP handler.
type Server struct {
	cfg     Config
	pages   map[string]*template.Template
	mux     *httpapi.Mux
	metrics metrics
	signIn  signInMetrics
	// precision are the gauges RefreshPrecision sets (precision.go).
	precision precisionMetrics
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
	s := &Server{cfg: cfg, mux: httpapi.NewMux()}
	f := promauto.With(cfg.Registry)
	s.metrics = metrics{
		actions: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_console_actions_total", Help: "Trust-and-safety actions by action and outcome."}, []string{"action", "outcome"}),
		logins:  f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_console_logins_total", Help: "Sign-in attempts by outcome."}, []string{"outcome"}),
	}
	s.signIn = newSignInMetrics(f)
	s.precision = newPrecisionMetrics(f)
	pages, err := parseTemplates()
	if err != nil {
		return nil, err
	}
	s.pages = pages
	if err := s.routes(); err != nil {
		return nil, err
	}
	return s, nil
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
