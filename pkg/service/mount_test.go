package service

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

func TestMountServesHealthTheDocumentAndTheAPI(t *testing.T) {
	api := httpapi.NewMux()
	api.HandleFunc("GET /v1/things", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusAccepted) })
	r := NewRunnerWith(Env{}, RunnerConfig{})
	m := r.Mount(API{Handler: api, Health: true, OpenAPI: []byte(`{"openapi":"3.1.0"}`)})
	require.Equal(t, []string{"GET /healthz", "GET /metrics", "GET " + httpapi.OpenAPIPath, "GET /readyz", "GET /v1/things"}, m.Routes())
	for path, want := range map[string]int{"/healthz": 200, "/readyz": 503, httpapi.OpenAPIPath: 200, "/v1/things": 202, "/nope": 404} {
		rec := httptest.NewRecorder()
		m.ServeHTTP(rec, httptest.NewRequest(http.MethodGet, path, nil))
		require.Equal(t, want, rec.Code, path)
	}
	require.Equal(t, []string{"GET /v1/things"}, r.Mount(API{Handler: api}).Routes(), "no health, no document: only the API")
}
