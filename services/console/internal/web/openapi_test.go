package web

import (
	"context"
	"net/http"
	"net/url"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/deferred"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/adjuster"
)

// TestOpenAPIDocumentMatchesServer holds the console to
// schemas/openapi/console.yaml: the routes the service mounts are exactly
// the document's, and real answers of a console on Redis and DynamoDB
// Local — the JSON API, every action as a bearer caller, every page,
// sign-in and refusals — match it.
func TestOpenAPIDocumentMatchesServer(t *testing.T) {
	d := openapitest.LoadBundled(t, openapi.Console)

	key := "fg:test:openapi:overrides:" + time.Now().Format("150405.000000000")
	e := newEnvWith(t, func(cfg *Config, _ string) { cfg.OverridesKey = key })
	t.Cleanup(func() { e.rdb.Del(context.Background(), key) })
	srv := d.Serve(t, service.API{Handler: e.web, Health: true}, httpapi.Options{})
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}

	now := time.Now().UTC()
	lift := e.seed(t, "oa_lift", now.Add(-3*time.Minute), events.PatternRapidFire, events.SeverityHigh, true)
	extend := e.seed(t, "oa_ext", now.Add(-2*time.Minute), events.PatternDistributedIP, events.SeverityMedium, true)
	allow := e.seed(t, "oa_allow", now.Add(-time.Minute), events.PatternScraping, events.SeverityLow, true)
	fp := e.seed(t, "oa_fp", now.Add(-30*time.Second), events.PatternBotLike, events.SeverityCritical, true)
	field := "principal:bot:" + e.run + "_ov"

	call := func(method, path, role string, form url.Values, invalid bool) openapitest.Response {
		t.Helper()
		h := http.Header{}
		if role != "" {
			h.Set("Authorization", "Bearer "+e.tokens[role])
		}
		body := ""
		if form != nil {
			h.Set("Content-Type", "application/x-www-form-urlencoded")
			body = form.Encode()
		}
		return d.Do(t, noRedirect, srv.URL, openapitest.Request{Method: method, Path: path, Header: h, Body: body, Invalid: invalid})
	}
	ok := func(method, path, role string, form url.Values) map[string]any {
		t.Helper()
		res := call(method, path, role, form, false)
		require.Equal(t, http.StatusOK, res.Status, "%s %s: %s", method, path, res.Body)
		if res.Header.Get("Content-Type") == "application/json" {
			return res.JSON(t)
		}
		return nil
	}

	// The JSON API.
	page := ok("GET", "/api/v1/alerts?limit=2", "viewer", nil)
	require.Len(t, page["alerts"], 2)
	require.NotEmpty(t, page["next"])
	require.Equal(t, http.StatusBadRequest, call("GET", "/api/v1/alerts?severity=extreme", "viewer", nil, true).Status)
	require.Equal(t, http.StatusUnauthorized, call("GET", "/api/v1/alerts", "", nil, true).Status)

	// Every action, as a program (an API token) does it.
	ok("POST", "/alert/lift", "analyst", url.Values{"p": {lift.Principal}, "k": {lift.SK}, "reason": {"load test"}})
	ok("POST", "/alert/extend", "analyst", url.Values{"p": {extend.Principal}, "k": {extend.SK}, "reason": {"still at it"}, "duration": {"1h"}})
	ok("POST", "/alert/allowlist", "analyst", url.Values{"p": {allow.Principal}, "k": {allow.SK}, "reason": {"partner"}, "duration": {"1h"}, "comment": {"c"}})
	ok("POST", "/alert/verdict", "analyst", url.Values{"p": {fp.Principal}, "k": {fp.SK}, "verdict": {"false_positive"}, "reason": {"declared bot"}, "duration": {"1d"}})
	ok("POST", "/api/v1/verdicts", "analyst", url.Values{"p": {extend.Principal}, "k": {extend.SK}, "verdict": {"confirmed"}, "reason": {"seen"}})
	ok("GET", "/api/v1/precision?by=route&days=2", "viewer", nil)
	require.Equal(t, http.StatusNotFound, call("GET", "/api/v1/proposals", "viewer", nil, false).Status, "no detector parameters topic configured")
	ok("POST", "/sre/overrides", "sre", url.Values{"field": {field}, "value": {`{"limits":{"free":9}}`}, "reason": {"INC-51"}})
	e.web.cfg.Deferred = deferred.NewStore(e.rdb)
	droute := "POST /openapi-test/" + e.run
	ok("POST", "/sre/deferred", "sre", url.Values{"route": {droute}, "action": {ActionDeferredPause}, "reason": {"INC-52"}})
	ok("POST", "/sre/deferred", "sre", url.Values{"route": {droute}, "action": {ActionDeferredResume}, "reason": {"INC-52 over"}})
	// A delete must name the value's tag (the page has it); without it the
	// override is not found, and the answer is still the document's.
	require.Equal(t, http.StatusNotFound, call("POST", "/sre/overrides/delete", "sre", url.Values{"field": {field}, "reason": {"INC-51 over"}}, false).Status)
	cidr := ok("POST", "/allowlist/cidr", "analyst", url.Values{"cidr": {"192.0.2.0/24"}, "duration": {"1h"}, "comment": {"c"}, "reason": {"r"}})
	ok("POST", "/allowlist/remove", "analyst", url.Values{"pk": {"detector#allow#cidr#" + cidr["cidr"].(string)}, "reason": {"r"}})
	// Without the adjuster and the dlq-auditor configured, their actions
	// are refused; the refusal is still the document's.
	for _, p := range []string{"/sre/adjuster/mode", "/sre/adjuster/rules", "/sre/dlq/replay", "/sre/dlq/purge", "/sre/whatif",
		"/sre/rollouts", "/sre/rollouts/promote", "/sre/rollouts/abort", "/sre/rollouts/rollback", "/sre/proposals/apply", "/api/v1/proposals/apply",
		"/sre/proposals/rollback", "/api/v1/proposals/rollback"} {
		res := call("POST", p, "sre", url.Values{"etag": {`"1"`}, "reason": {"r"}, "rules": {"tick: 30s"}, "id": {"t.dlq/0/1"}, "confirm": {"yes"}}, false)
		require.GreaterOrEqual(t, res.Status, 400, p)
	}
	require.Equal(t, http.StatusForbidden, call("POST", "/alert/lift", "viewer", url.Values{"p": {lift.Principal}, "k": {lift.SK}, "reason": {"x"}}, false).Status)

	// Every page.
	for _, p := range []string{"/alerts", "/alerts/new?after=" + url.QueryEscape(now.Add(-time.Hour).Format("2006-01-02T15:04:05.000Z")),
		alertPath(lift), "/principals/bot/" + url.PathEscape(e.run+"_oa_lift"), "/sre/adjuster", "/sre/dlq", "/sre/overrides",
		"/sre/rollouts", "/sre/proposals", "/sre/deferred", "/sre/block-rate", "/sre/whatif", "/scales", "/false-positives", "/precision", "/allowlist", "/login", "/static/style.css", "/static/app.js"} {
		// Pages of services this console has no client for say so, with a 503.
		res := call("GET", p, "admin", nil, false)
		require.Contains(t, []int{http.StatusOK, http.StatusServiceUnavailable}, res.Status, p)
	}
	call("GET", "/sre/dlq/record?id=t.dlq/0/1", "admin", nil, false)
	require.Equal(t, http.StatusSeeOther, call("GET", "/alerts", "", nil, true).Status, "a browser without a session goes to /login")
	require.Equal(t, http.StatusSeeOther, call("GET", "/", "", nil, false).Status)
	require.Equal(t, http.StatusNotFound, call("GET", "/static/nope.css", "", nil, false).Status)

	// Sign-in, and out.
	res := call("POST", "/login", "", url.Values{"username": {"viewer1"}, "password": {"wrong"}, "csrf": {"forged"}}, false)
	require.Equal(t, http.StatusForbidden, res.Status, "no login cookie: the CSRF check fails")
	require.Equal(t, http.StatusSeeOther, call("POST", "/logout", "viewer", url.Values{}, false).Status)

	for _, p := range []string{"/healthz", "/readyz", "/metrics", httpapi.OpenAPIPath} {
		call("GET", p, "", nil, false)
	}
	d.CheckCovered(t)
}

// oasConsole serves e's console as the service does (behind the runner and
// httpapi.Middleware) and checks every call against the document.
type oasConsole struct {
	d   *openapitest.Doc
	e   *testEnv
	url string
}

func serveChecked(t *testing.T, d *openapitest.Doc, e *testEnv) *oasConsole {
	t.Helper()
	srv := d.Serve(t, service.API{Handler: e.web, Health: true}, httpapi.Options{})
	return &oasConsole{d: d, e: e, url: srv.URL}
}

func (c *oasConsole) call(t *testing.T, method, path, role string, form url.Values) openapitest.Response {
	t.Helper()
	h := http.Header{"Authorization": {"Bearer " + c.e.tokens[role]}}
	body := ""
	if form != nil {
		h.Set("Content-Type", "application/x-www-form-urlencoded")
		body = form.Encode()
	}
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	return c.d.Do(t, noRedirect, c.url, openapitest.Request{Method: method, Path: path, Header: h, Body: body})
}

// TestOpenAPIDocumentMatchesServerWithServices: the console's SRE pages and
// actions with the real adjuster and dlq-auditor binaries behind them
// (TestOpenAPIDocumentMatchesServer has none configured and sees only
// their refusals).
func TestOpenAPIDocumentMatchesServerWithServices(t *testing.T) {
	d := openapitest.LoadBundled(t, openapi.Console)

	e := newEnvWith(t, func(cfg *Config, prefix string) {
		adjURL, adjToken := startAdjuster(t, prefix)
		c, err := adjuster.New(adjURL, adjToken, nil)
		require.NoError(t, err)
		cfg.Adjuster = c
	})
	c := serveChecked(t, d, e)
	res := c.call(t, "GET", "/sre/adjuster", "sre", nil)
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	res = c.call(t, "POST", "/sre/adjuster/mode", "sre", url.Values{"etag": {`"0"`}, "dry_run": {"on"}, "reason": {"try it"}})
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	require.EqualValues(t, 1, res.JSON(t)["version"])
	res = c.call(t, "POST", "/sre/adjuster/rules", "sre", url.Values{"etag": {`"1"`},
		"rules": {`{"cpu_high":{"above":0.93,"clear_below":0.88}}`}, "reason": {"INC-42"}})
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	res = c.call(t, "POST", "/sre/adjuster/rules", "sre", url.Values{"etag": {`"2"`},
		"rules": {`{"cpu_high":{"above":0.5,"clear_below":0.9}}`}, "reason": {"inverted"}})
	require.Equal(t, http.StatusUnprocessableEntity, res.Status, "the adjuster's refusal, passed on")

	dl := startDeadLetters(t)
	c = serveChecked(t, d, dl.env)
	for _, p := range []string{"/sre/dlq", "/sre/dlq/record?id=" + url.QueryEscape(dl.goodID)} {
		res = c.call(t, "GET", p, "sre", nil)
		require.Equal(t, http.StatusOK, res.Status, p)
	}
	res = c.call(t, "POST", "/sre/dlq/replay", "sre", url.Values{"id": {dl.goodID}, "reason": {"INC-9: fixed"}})
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	require.EqualValues(t, 1, res.JSON(t)["published"])
	res = c.call(t, "POST", "/sre/dlq/purge", "sre", url.Values{"id": {dl.poisonID}, "reason": {"INC-9: poison"}, "confirm": {"yes"}})
	require.Equal(t, http.StatusOK, res.Status, string(res.Body))
	require.EqualValues(t, 1, res.JSON(t)["purged"])
	res = c.call(t, "GET", "/principals/bot/"+url.PathEscape(dl.decision.Principal.ID), "sre", nil)
	require.Equal(t, http.StatusOK, res.Status, "the principal page with the quota service's usage")
}
