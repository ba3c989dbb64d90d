package admin

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/loop"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/settings"
)

// Store keeps the settings and the audit log.
type Store interface {
	Get(ctx context.Context) (settings.Settings, bool, error)
	Put(ctx context.Context, expected int64, next settings.Settings, rec settings.AuditRecord) error
	Audit(ctx context.Context, limit int32) ([]settings.AuditRecord, error)
}

// Loop is the running control loop.
type Loop interface {
	Status() loop.Status
	Use(s settings.Settings)
	Nudge()
}

// Limits on what a change may ask for.
const (
	MaxReason      = 1024
	MaxOverrideTTL = 7 * 24 * time.Hour
	MaxBody        = 64 << 10 // request body limit
)

// Config wires a Server.
type Config struct {
	Tokens   *httpapi.Tokens
	Store    Store
	Loop     Loop
	Defaults control.Rules // used while no settings are stored
	Now      func() time.Time
	Logger   *slog.Logger
}

// Server is the admin HTTP API. Its health endpoints, metrics
// (floodgate_adjuster_admin_requests_total{route,code}) and correlation ids
// come from the service runner and pkg/httpapi.
type Server struct {
	cfg  Config
	auth *httpapi.Auth
}

// NewServer returns the API.
func NewServer(cfg Config) *Server {
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.New(slog.DiscardHandler)
	}
	s := &Server{cfg: cfg}
	s.auth = &httpapi.Auth{Tokens: cfg.Tokens, Roles: roles(), Realm: "floodgate-adjuster", Now: cfg.Now,
		Audit: func(ctx context.Context, e httpapi.AuthEvent) {
			if e.Outcome != httpapi.AuthAllowed {
				cfg.Logger.WarnContext(ctx, "admin request refused", "route", e.Route, "reason", string(e.Outcome),
					"actor", e.Caller.Name, "role", e.Caller.Role)
			}
		}}
	return s
}

// Handler routes the API (wrap it in httpapi.Middleware, as the runner does,
// for correlation ids).
func (s *Server) Handler() http.Handler {
	mux := httpapi.NewMux() // lists its routes for the OpenAPI drift test
	s.route(mux, "GET /v1/settings", RoleViewer, s.getSettings)
	s.route(mux, "PUT /v1/settings/rules", RoleSRE, s.putRules)
	s.route(mux, "PUT /v1/settings/mode", RoleSRE, s.putMode)
	s.route(mux, "PUT /v1/overrides", RoleSRE, s.putOverride)
	s.route(mux, "DELETE /v1/overrides", RoleSRE, s.deleteOverride)
	s.route(mux, "GET /v1/status", RoleViewer, s.getStatus)
	s.route(mux, "GET /v1/audit", RoleViewer, s.getAudit)
	return mux
}

// request is one authenticated call.
type request struct {
	*http.Request
	who  httpapi.Caller
	corr string
}

func fail(status int, typ, format string, args ...any) *httpapi.Error {
	return httpapi.Errorf(status, typ, format, args...)
}

func (s *Server) route(mux *httpapi.Mux, pattern, role string, h func(http.ResponseWriter, *request) error) {
	name := pattern[strings.IndexByte(pattern, ' ')+1:]
	mux.Handle(pattern, s.auth.Require(name, role, httpapi.Handle(s.cfg.Logger, func(w http.ResponseWriter, r *http.Request) error {
		who, _ := httpapi.CallerFrom(r.Context())
		return h(w, &request{Request: r, who: who, corr: httpapi.RequestID(r.Context())})
	})))
}

func writeJSON(w http.ResponseWriter, status int, v any) { httpapi.WriteJSON(w, status, v) }

func etag(version int64) string { return `"` + strconv.FormatInt(version, 10) + `"` }

// current returns the stored settings, or the defaults at version 0.
func (s *Server) current(ctx context.Context) (settings.Settings, error) {
	return settings.Current(ctx, s.cfg.Store, s.cfg.Defaults)
}

func (s *Server) getSettings(w http.ResponseWriter, r *request) error {
	st, err := s.current(r.Context())
	if err != nil {
		return err
	}
	w.Header().Set("ETag", etag(st.Version))
	writeJSON(w, http.StatusOK, st)
	return nil
}

func (s *Server) getStatus(w http.ResponseWriter, _ *request) error {
	writeJSON(w, http.StatusOK, s.cfg.Loop.Status())
	return nil
}

func (s *Server) getAudit(w http.ResponseWriter, r *request) error {
	limit := 50
	if v := r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil || n < 1 || n > 500 {
			return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "limit %q: want 1..500", v)
		}
		limit = n
	}
	recs, err := s.cfg.Store.Audit(r.Context(), int32(limit))
	if err != nil {
		return err
	}
	writeJSON(w, http.StatusOK, map[string]any{"records": recs})
	return nil
}

// change runs one audited, version-checked change: mutate edits a copy of the
// current settings and returns a validation error as an *apiError.
func (s *Server) change(w http.ResponseWriter, r *request, action, reason string, mutate func(*settings.Settings) error) error {
	if reason = strings.TrimSpace(reason); reason == "" || len(reason) > MaxReason {
		return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "reason is required (1-%d characters): say why", MaxReason)
	}
	match := r.Header.Get("If-Match")
	if match == "" {
		return fail(http.StatusPreconditionRequired, httpapi.ProblemPreconditionRequired, "send If-Match with the ETag of GET /v1/settings")
	}
	want, err := strconv.ParseInt(strings.Trim(strings.TrimPrefix(match, "W/"), `"`), 10, 64)
	if err != nil {
		return fail(http.StatusPreconditionFailed, httpapi.ProblemPreconditionFailed, "If-Match %q is not a settings ETag", match)
	}
	ctx := r.Context()
	before, err := s.current(ctx)
	if err != nil {
		return err
	}
	if before.Version != want {
		w.Header().Set("ETag", etag(before.Version))
		return fail(http.StatusPreconditionFailed, httpapi.ProblemPreconditionFailed, "settings are at version %d, not %d: read them again", before.Version, want)
	}
	now := s.cfg.Now().UTC()
	after := before.Clone()
	after.Prune(now)
	if err := mutate(&after); err != nil {
		return err
	}
	if err := after.Rules.Validate(); err != nil {
		return fail(http.StatusUnprocessableEntity, httpapi.ProblemUnprocessable, "%v", err)
	}
	after.Version = before.Version + 1
	after.UpdatedAt, after.UpdatedBy = now, r.who.Name
	bj, _ := json.Marshal(before)
	aj, err := json.Marshal(after)
	if err != nil {
		return fmt.Errorf("encode settings: %w", err)
	}
	rec := settings.AuditRecord{
		ID: uuid.NewString(), At: now, Actor: r.who.Name, Role: r.who.Role, Action: action, Reason: reason,
		CorrelationID: r.corr, VersionBefore: before.Version, VersionAfter: after.Version, Before: bj, After: aj,
	}
	if err := s.cfg.Store.Put(ctx, before.Version, after, rec); err != nil {
		if errors.Is(err, settings.ErrConflict) {
			return fail(http.StatusPreconditionFailed, httpapi.ProblemPreconditionFailed, "settings changed concurrently: read them again")
		}
		return err
	}
	s.cfg.Logger.InfoContext(ctx, "settings changed", "action", action, "actor", r.who.Name, "version", after.Version,
		"reason", reason)
	if s.cfg.Loop != nil {
		s.cfg.Loop.Use(after)
		s.cfg.Loop.Nudge()
	}
	w.Header().Set("ETag", etag(after.Version))
	writeJSON(w, http.StatusOK, map[string]any{"settings": after, "audit_id": rec.ID})
	return nil
}

func decode(r *request, v any) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "body: %v", err)
	}
	return nil
}

func readBody(r *request) ([]byte, error) {
	r.Body = http.MaxBytesReader(nil, r.Body, MaxBody)
	return httpapi.ReadBody(r.Request)
}

// putRules replaces the fields the body names; fields left out keep their values.
func (s *Server) putRules(w http.ResponseWriter, r *request) error {
	body, err := readBody(r)
	if err != nil {
		return err
	}
	var env struct {
		Rules  json.RawMessage `json:"rules"`
		Reason string          `json:"reason"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&env); err != nil || len(env.Rules) == 0 {
		return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, `body: want {"rules": {...}, "reason": "..."}`)
	}
	return s.change(w, r, "rules.update", env.Reason, func(st *settings.Settings) error {
		var keys map[string]json.RawMessage
		if err := json.Unmarshal(env.Rules, &keys); err != nil {
			return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "rules: %v", err)
		}
		if _, ok := keys["scopes"]; ok {
			st.Rules.Scopes = nil // the body's scopes replace the old set
		}
		d := json.NewDecoder(bytes.NewReader(env.Rules))
		d.DisallowUnknownFields()
		if err := d.Decode(&st.Rules); err != nil {
			return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "rules: %v", err)
		}
		return nil
	})
}

func (s *Server) putMode(w http.ResponseWriter, r *request) error {
	var body struct {
		DryRun *bool  `json:"dry_run"`
		Frozen *bool  `json:"frozen"`
		Reason string `json:"reason"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	if body.DryRun == nil && body.Frozen == nil {
		return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "set dry_run and/or frozen")
	}
	return s.change(w, r, "mode.update", body.Reason, func(st *settings.Settings) error {
		if body.DryRun != nil {
			st.DryRun = *body.DryRun
		}
		if body.Frozen != nil {
			st.Frozen = *body.Frozen
		}
		return nil
	})
}

func (s *Server) putOverride(w http.ResponseWriter, r *request) error {
	var body struct {
		Scope  string           `json:"scope"`
		Scale  float64          `json:"scale"`
		TTL    control.Duration `json:"ttl"`
		Reason string           `json:"reason"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	if err := control.ValidScope(body.Scope); err != nil {
		return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "%v", err)
	}
	if !(body.Scale > 0 && body.Scale <= 10) {
		return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "scale %g: must be in (0, 10]", body.Scale)
	}
	if body.TTL.D() < time.Minute || body.TTL.D() > MaxOverrideTTL {
		return fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "ttl %s: must be in 1m..%s", body.TTL, MaxOverrideTTL)
	}
	return s.change(w, r, "override.set", body.Reason, func(st *settings.Settings) error {
		if _, ok := st.Rules.Scopes[body.Scope]; !ok {
			return fail(http.StatusUnprocessableEntity, httpapi.ProblemUnprocessable, "scope %q is not managed; add it to the rules' scopes first", body.Scope)
		}
		now := s.cfg.Now().UTC()
		st.Overrides[body.Scope] = settings.Override{Scale: body.Scale, ExpiresAt: now.Add(body.TTL.D()),
			Actor: r.who.Name, Reason: strings.TrimSpace(body.Reason), SetAt: now}
		return nil
	})
}

func (s *Server) deleteOverride(w http.ResponseWriter, r *request) error {
	var body struct {
		Scope  string `json:"scope"`
		Reason string `json:"reason"`
	}
	if err := decode(r, &body); err != nil {
		return err
	}
	return s.change(w, r, "override.delete", body.Reason, func(st *settings.Settings) error {
		if _, ok := st.Overrides[body.Scope]; !ok {
			return fail(http.StatusNotFound, httpapi.ProblemNotFound, "no active override on scope %q", body.Scope)
		}
		delete(st.Overrides, body.Scope)
		return nil
	})
}
