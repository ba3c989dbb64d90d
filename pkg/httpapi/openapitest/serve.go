package openapitest

import (
	"net/http/httptest"
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/service"
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
	return srv
}
