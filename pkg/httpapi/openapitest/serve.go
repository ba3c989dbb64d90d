package openapitest

import (
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
)

// Serve mounts api with the document as its OpenAPI document the way a
// service's runner does, fails t unless the mounted routes are exactly the
// document's operations (CheckRoutes), and serves the mount behind httpapi's
// middleware (mw) until the test ends.
func (d *Doc) Serve(t testing.TB, api service.API, mw httpapi.Options) *httptest.Server {
	t.Helper()
	api.OpenAPI = d.src
	mounted := service.NewRunnerWith(service.Env{}, service.RunnerConfig{}).Mount(api)
	d.CheckRoutes(t, mounted.Routes())
	srv := httptest.NewServer(httpapi.Middleware(mw, mounted))
	t.Cleanup(srv.Close)
	CheckUnmatched(t, srv.URL, httpapi.OpenAPIPath)
	return srv
}

// CheckUnmatched fails t unless the service at base answers a path it does
// not serve with a 404 problem and servedGET (a path it serves for GET) with
// another method with a 405 problem carrying Allow: every refusal is
// application/problem+json with a correlation id, never text/plain.
func CheckUnmatched(t testing.TB, base, servedGET string) {
	t.Helper()
	for _, tc := range []struct {
		method, path string
		status       int
		typ          string
	}{
		{http.MethodGet, "/floodgate-no-such-path", http.StatusNotFound, httpapi.ProblemNotFound},
		{http.MethodDelete, servedGET, http.StatusMethodNotAllowed, httpapi.ProblemMethodNotAllowed},
	} {
		req, err := http.NewRequest(tc.method, base+tc.path, nil)
		require.NoError(t, err)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		raw, err := io.ReadAll(resp.Body)
		resp.Body.Close()
		require.NoError(t, err)
		require.Equal(t, tc.status, resp.StatusCode, "%s %s%s: %s", tc.method, base, tc.path, raw)
		require.Equal(t, httpapi.ContentTypeProblem, resp.Header.Get("Content-Type"), "%s %s%s: %s", tc.method, base, tc.path, raw)
		var p httpapi.Problem
		require.NoError(t, json.Unmarshal(raw, &p), "%s", raw)
		require.Equal(t, tc.typ, p.Type)
		require.Equal(t, tc.status, p.Status)
		require.NotEmpty(t, p.CorrelationID, "%s", raw)
		if tc.status == http.StatusMethodNotAllowed {
			require.Contains(t, resp.Header.Get("Allow"), http.MethodGet)
		}
	}
}

// CheckServed fails t unless the service at base (scheme://host:port) answers
// GET httpapi.OpenAPIPath with 200 and doc (compared as JSON).
func CheckServed(t testing.TB, base string, doc []byte) {
	t.Helper()
	resp, err := http.Get(base + httpapi.OpenAPIPath)
	require.NoError(t, err)
	served, err := io.ReadAll(resp.Body)
	resp.Body.Close()
	require.NoError(t, err)
	require.Equal(t, http.StatusOK, resp.StatusCode)
	require.JSONEq(t, string(doc), string(served), "GET %s%s serves the service's OpenAPI document", base, httpapi.OpenAPIPath)
}

// LoadBundled is Load of a document bundled in schemas/openapi (openapi.Limiter,
// openapi.Console, ...); Doc.Serve serves it as the service's document.
func LoadBundled(t testing.TB, name string) *Doc {
	t.Helper()
	doc, err := openapi.JSON(name)
	require.NoError(t, err)
	return Load(t, doc)
}
