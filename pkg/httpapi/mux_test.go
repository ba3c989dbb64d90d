package httpapi

import (
	"encoding/json"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestMuxRoutesListsPatternsAndMounts(t *testing.T) {
	api := NewMux()
	api.HandleFunc("POST /v1/check", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusTeapot) })
	api.Handle("GET /v1/items/{id}", http.NotFoundHandler())
	front := NewMux()
	front.Handle("GET /healthz", NewMux()) // a Mux under a method pattern is not a mount
	front.Handle("/", api)
	front.HandleFunc("POST /v1/check", func(http.ResponseWriter, *http.Request) {}) // twice: listed once
	require.Equal(t, []string{"GET /healthz", "GET /v1/items/{id}", "POST /v1/check"}, front.Routes())
	require.Equal(t, front.Routes(), Routes(front))
	require.Nil(t, Routes(http.NotFoundHandler()), "a handler that cannot tell its routes")

	rec := httptest.NewRecorder()
	api.ServeHTTP(rec, httptest.NewRequest(http.MethodPost, "/v1/check", nil))
	require.Equal(t, http.StatusTeapot, rec.Code, "it routes like http.ServeMux")
}

func TestOpenAPIHandlerServesTheDocumentWithAnETag(t *testing.T) {
	h := OpenAPIHandler([]byte(`{"openapi":"3.1.0"}`))
	rec := httptest.NewRecorder()
	h.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, OpenAPIPath, nil))
	require.Equal(t, http.StatusOK, rec.Code)
	require.Equal(t, "application/json", rec.Header().Get("Content-Type"))
	require.JSONEq(t, `{"openapi":"3.1.0"}`, rec.Body.String())
	etag := rec.Header().Get("ETag")
	require.Regexp(t, `^"[0-9a-f]{32}"$`, etag)

	rec = httptest.NewRecorder()
	req := httptest.NewRequest(http.MethodGet, OpenAPIPath, nil)
	req.Header.Set("If-None-Match", etag)
	h.ServeHTTP(rec, req)
	require.Equal(t, http.StatusNotModified, rec.Code)
	require.Empty(t, rec.Body.String())

	rec = httptest.NewRecorder()
	OpenAPIHandler([]byte(`{"openapi":"3.1.1"}`)).ServeHTTP(rec, req)
	require.Equal(t, http.StatusOK, rec.Code, "another document has another ETag")
}

// TestMuxAnswersUnmatchedAsProblems: a path no route serves is a 404
// problem, a served path with another method a 405 problem with Allow.
func TestMuxAnswersUnmatchedAsProblems(t *testing.T) {
	m := NewMux()
	m.HandleFunc("GET /v1/things", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	for _, tc := range []struct {
		method, path string
		status       int
		typ          string
	}{
		{http.MethodGet, "/nope", http.StatusNotFound, ProblemNotFound},
		{http.MethodDelete, "/v1/things", http.StatusMethodNotAllowed, ProblemMethodNotAllowed},
	} {
		w := httptest.NewRecorder()
		m.ServeHTTP(w, httptest.NewRequest(tc.method, tc.path, nil))
		require.Equal(t, tc.status, w.Code)
		require.Equal(t, ContentTypeProblem, w.Header().Get("Content-Type"))
		var p Problem
		require.NoError(t, json.Unmarshal(w.Body.Bytes(), &p))
		require.Equal(t, tc.typ, p.Type)
		if tc.status == http.StatusMethodNotAllowed {
			require.Contains(t, w.Header().Get("Allow"), http.MethodGet)
		}
	}
	w := httptest.NewRecorder()
	m.ServeHTTP(w, httptest.NewRequest(http.MethodGet, "/v1/things", nil))
	require.Equal(t, http.StatusNoContent, w.Code, "matched routes are untouched")
}

// TestMuxKnownRoutesAgreeWithServeMux: what the Mux takes as surely matched
// without a lookup, http.ServeMux matches too (a pattern), for the limiter's
// two muxes (the runner's front with its "/" mount, the API's exact routes)
// and one with wildcards, subtrees and a host; requests of every kind,
// unclean and escaped paths, HEAD and CONNECT included.
func TestMuxKnownRoutesAgreeWithServeMux(t *testing.T) {
	ok := func(http.ResponseWriter, *http.Request) {}
	api := NewMux()
	api.HandleFunc("POST /v1/check", ok)
	api.HandleFunc("POST /v1/check/batch", ok)
	front := NewMux()
	front.HandleFunc("GET /healthz", ok)
	front.HandleFunc("GET /metrics", ok)
	front.OnlyGET("/healthz")
	front.OnlyGET("/metrics")
	front.Handle("/", api)
	other := NewMux()
	other.HandleFunc("GET /v1/items/{id}", ok)
	other.HandleFunc("/static/", ok)
	other.HandleFunc("example.com/v1/host", ok)
	other.HandleFunc("DELETE\t/v1/items", ok)
	other.HandleFunc("/v1/any", ok)
	other.HandleFunc("GET /v1/a%2Fb", ok)
	rootGET := NewMux()
	rootGET.HandleFunc("GET /", ok)
	rootGET.HandleFunc("POST /v1/check", ok)
	paths := []string{"/v1/check", "/v1/check/", "/v1/check/batch", "/v1//check", "/v1/./check", "/v1/x/../check", "/V1/check",
		"/healthz", "/metrics", "/", "", "*", "/v1/items", "/v1/items/7", "/static", "/static/a.css", "/v1/host", "/v1/any",
		"/v1/a%2Fb", "/v1/%63heck", "/nothing"}
	methods := []string{http.MethodGet, http.MethodHead, http.MethodPost, http.MethodDelete, http.MethodOptions, http.MethodConnect, "BREW"}
	surely := 0
	for name, m := range map[string]*Mux{"api": api, "front": front, "other": other, "rootGET": rootGET} {
		for _, p := range paths {
			for _, method := range methods {
				for _, host := range []string{"limiter.local", "example.com"} {
					r := httptest.NewRequest(http.MethodGet, "http://"+host+"/", nil)
					r.Method = method
					u, err := r.URL.Parse(p)
					require.NoError(t, err)
					r.URL, r.Host = u, host
					_, pattern := m.mux.Handler(r)
					if m.known.matches(r) {
						surely++
						require.NotEmpty(t, pattern, "%s: %s %s (host %s) taken as matched, ServeMux matches nothing", name, method, p, host)
					}
				}
			}
		}
	}
	require.Greater(t, surely, 100, "the fast path is taken")
}
