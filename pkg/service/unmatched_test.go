package service_test

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/pkg/service"
)

// TestUnmatchedAreProblems: every shape of port a service serves through
// the runner — health only (the detector's, the deferred worker's), health
// with an API and its document (the others'), an API alone (the limiter's
// pprof port) — answers a path it does not serve with a 404 problem and a
// wrong method with a 405 problem, not http.ServeMux's text/plain.
func TestUnmatchedAreProblems(t *testing.T) {
	api := httpapi.NewMux()
	api.HandleFunc("GET /v1/things", func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(http.StatusNoContent) })
	run := service.NewRunnerWith(service.Env{}, service.RunnerConfig{})
	for _, tc := range []struct {
		name      string
		h         http.Handler
		servedGET string
	}{
		{"health only", run.Mount(service.API{Health: true}), "/healthz"},
		{"health, API and document", run.Mount(service.API{Health: true, Handler: api, OpenAPI: []byte(`{"openapi":"3.1.0"}`)}), "/v1/things"},
		{"an API alone", api, "/v1/things"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := httptest.NewServer(httpapi.Middleware(httpapi.Options{}, tc.h))
			t.Cleanup(srv.Close)
			openapitest.CheckUnmatched(t, srv.URL, tc.servedGET)
		})
	}
}
