package web

import (
	"embed"
	"fmt"
	"io/fs"
	"net/http"

	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
)

//go:embed static
var staticFS embed.FS

// routes registers every page and API with the role it needs; each handler
// lives in the file of its page (alerts.go, alert.go, principal.go,
// allowlist.go, sre_*.go, login.go, api.go).
func (s *Server) routes() error {
	static, err := fs.Sub(staticFS, "static")
	if err != nil {
		return fmt.Errorf("static assets: %w", err)
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
	s.route("POST /alert/verdict", s.authed(auth.RoleAnalyst, s.verdict))
	s.route("POST /api/v1/verdicts", s.authed(auth.RoleAnalyst, s.verdict))
	s.route("GET /precision", s.authed(auth.RoleViewer, s.precisionPage))
	s.route("GET /api/v1/precision", s.authed(auth.RoleViewer, s.apiPrecision))
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
	s.route("GET /sre/proposals", s.authed(auth.RoleViewer, s.proposalsPage))
	s.route("POST /sre/proposals/apply", s.authed(auth.RoleSRE, s.proposalApply))
	s.route("GET /api/v1/proposals", s.authed(auth.RoleViewer, s.apiProposals))
	s.route("POST /api/v1/proposals/apply", s.authed(auth.RoleSRE, s.proposalApply))
	s.route("POST /sre/proposals/rollback", s.authed(auth.RoleSRE, s.paramsRollback))
	s.route("POST /api/v1/proposals/rollback", s.authed(auth.RoleSRE, s.paramsRollback))
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
	return nil
}

func (s *Server) route(pattern string, h http.HandlerFunc) { s.mux.HandleFunc(pattern, h) }

// Routes lists the patterns served (the OpenAPI drift test compares them
// with schemas/openapi/console.yaml).
func (s *Server) Routes() []string { return s.mux.Routes() }
