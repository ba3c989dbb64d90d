package admin

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/effects"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/loop"
)

// hotSource reports a hot CPU, so a tick cuts the global scale.
type hotSource struct{}

func (hotSource) Read(_ context.Context, now time.Time, _ time.Duration) (control.Signals, error) {
	r := func(v float64) control.Reading {
		return control.Reading{Value: v, At: now.Add(-5 * time.Second), OK: true}
	}
	return control.Signals{CPU: r(0.95), Mem: r(0.5), ErrorRate: r(0.01), AbuseRate: control.Reading{}}, nil
}

type nopPublisher struct{}

func (nopPublisher) Publish(context.Context, []events.Adjustment) error { return nil }

// TestOpenAPIDocumentMatchesServer holds the admin API to
// schemas/openapi/adjuster.yaml: the routes the service mounts are exactly
// the document's, and real answers — settings and audit on DynamoDB Local,
// the status of a real loop after a tick, every kind of refusal — match it.
func TestOpenAPIDocumentMatchesServer(t *testing.T) {
	stacktest.Needs(t, "needs the local stack: `make test` runs it (`make test-unit` is -short, no stack)")
	d := openapitest.LoadBundled(t, openapi.Adjuster)

	store := dynamoStore(t)
	tokens, sreTok, viewerTok := testTokens(t)
	l := loop.New(loop.Config{Source: hotSource{}, Scales: &effects.MemScales{}, Publisher: nopPublisher{}, Settings: store,
		Defaults: control.Defaults(), ActorID: "adjuster@openapi-test"})
	srv := NewServer(Config{Tokens: tokens, Store: store, Loop: l, Defaults: control.Defaults()})
	hs := d.Serve(t, service.API{Handler: srv.Handler(), Health: true}, httpapi.Options{MaxBody: MaxBody})

	do := func(method, path, token, ifMatch, body string, invalid bool) openapitest.Response {
		t.Helper()
		h := http.Header{"X-Request-Id": {"oa-" + strings.ToLower(method)}}
		if token != "" {
			h.Set("Authorization", "Bearer "+token)
		}
		if ifMatch != "" {
			h.Set("If-Match", ifMatch)
		}
		if body != "" {
			h.Set("Content-Type", "application/json")
		}
		return d.Do(t, nil, hs.URL, openapitest.Request{Method: method, Path: path, Header: h, Body: body, Invalid: invalid})
	}

	// Before any change and any tick: defaults at version 0, an empty audit, a zero status.
	require.Equal(t, http.StatusOK, do("GET", "/v1/status", viewerTok, "", "", false).Status)
	require.Equal(t, http.StatusOK, do("GET", "/v1/audit", viewerTok, "", "", false).Status)
	res := do("GET", "/v1/settings", viewerTok, "", "", false)
	require.Equal(t, http.StatusOK, res.Status)
	require.Equal(t, `"0"`, res.Header.Get("ETag"))

	require.Equal(t, http.StatusOK, do("PUT", "/v1/settings/rules", sreTok, `"0"`, `{"rules":{"cpu_high":{"above":0.9,"clear_below":0.85}},"reason":"INC-42"}`, false).Status)
	require.Equal(t, http.StatusOK, do("PUT", "/v1/settings/mode", sreTok, `"1"`, `{"dry_run":false,"reason":"enforce"}`, false).Status)
	require.Equal(t, http.StatusOK, do("PUT", "/v1/overrides", sreTok, `"2"`, `{"scope":"tier:ip","scale":0.25,"ttl":"30m","reason":"botnet"}`, false).Status)
	require.NoError(t, l.Start(context.Background()))
	l.Tick(context.Background())
	res = do("GET", "/v1/status", viewerTok, "", "", false)
	require.Equal(t, http.StatusOK, res.Status)
	require.NotEmpty(t, res.JSON(t)["changes"], "the hot CPU cut a scale: the status has a change to check")
	require.Equal(t, http.StatusOK, do("DELETE", "/v1/overrides", sreTok, `"3"`, `{"scope":"tier:ip","reason":"gone"}`, false).Status)
	res = do("GET", "/v1/audit?limit=10", viewerTok, "", "", false)
	require.Equal(t, http.StatusOK, res.Status)
	require.Len(t, res.JSON(t)["records"], 4)

	// Refusals.
	for _, c := range []struct {
		method, path, token, ifMatch, body string
		invalid                            bool
		want                               int
	}{
		{"GET", "/v1/settings", "", "", "", true, http.StatusUnauthorized},
		{"PUT", "/v1/settings/mode", viewerTok, `"4"`, `{"frozen":true,"reason":"x"}`, false, http.StatusForbidden},
		{"PUT", "/v1/settings/mode", sreTok, "", `{"frozen":true,"reason":"x"}`, true, http.StatusPreconditionRequired},
		{"PUT", "/v1/settings/mode", sreTok, `"1"`, `{"frozen":true,"reason":"x"}`, false, http.StatusPreconditionFailed},
		{"PUT", "/v1/settings/mode", sreTok, `"4"`, `{"frozen":true}`, true, http.StatusBadRequest},
		{"PUT", "/v1/settings/rules", sreTok, `"4"`, `{"rules":{"cpu_high":{"above":0.5,"clear_below":0.9}},"reason":"inverted"}`, false, http.StatusUnprocessableEntity},
		{"PUT", "/v1/overrides", sreTok, `"4"`, `{"scope":"route:nope","scale":0.5,"ttl":"1h","reason":"x"}`, false, http.StatusUnprocessableEntity},
		{"DELETE", "/v1/overrides", sreTok, `"4"`, `{"scope":"global","reason":"none there"}`, false, http.StatusNotFound},
		{"PUT", "/v1/settings/rules", sreTok, `"4"`, `{"rules":{},"reason":"` + strings.Repeat("x", MaxBody) + `"}`, true, http.StatusRequestEntityTooLarge},
		{"GET", "/v1/audit?limit=0", viewerTok, "", "", true, http.StatusBadRequest},
	} {
		res := do(c.method, c.path, c.token, c.ifMatch, c.body, c.invalid)
		require.Equal(t, c.want, res.Status, "%s %s: %s", c.method, c.path, res.Body)
	}
	for _, p := range []string{"/healthz", "/readyz", "/metrics", httpapi.OpenAPIPath} {
		do("GET", p, "", "", "", false)
	}
	d.CheckCovered(t)
}
