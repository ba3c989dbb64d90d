package openapitest

import (
	"fmt"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestOperationMapsServeMuxPatterns(t *testing.T) {
	for pattern, want := range map[string]string{
		"GET /v1/usage/{kind}/{id}": "GET /v1/usage/{kind}/{id}",
		"GET /files/{rest...}":      "GET /files/{rest}",
		"GET /{$}":                  "GET /",
		"GET /static/":              "GET /static/{path}",
		"/debug/pprof/":             "* /debug/pprof/{path}",
		"POST /v1/check":            "POST /v1/check",
	} {
		require.Equal(t, want, Operation(pattern), pattern)
	}
}

// recorder is a testing.TB that keeps what a check reports.
type recorder struct {
	testing.TB
	errs []string
}

func (r *recorder) Errorf(format string, args ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, args...))
}
func (r *recorder) Helper() {}

const doc = `{"openapi":"3.1.0","info":{"title":"t","version":"1"},
 "paths":{"/v1/x/{id}":{"get":{"parameters":[{"name":"id","in":"path","required":true,"schema":{"type":"string"}}],
   "responses":{"200":{"description":"ok"}}}},
  "/v1/y":{"post":{"requestBody":{"content":{"application/json":{"schema":{"type":"object","required":["n"],
   "properties":{"n":{"type":"integer","minimum":1}}},"examples":{"good":{"value":{"n":1}},"bad":{"value":{"n":0}}}}}},
   "responses":{"200":{"description":"ok"}}}}}}`

func TestCheckRoutesNamesEveryDifference(t *testing.T) {
	d := Load(t, []byte(doc))
	r := &recorder{TB: t}
	d.CheckRoutes(r, []string{"GET /v1/x/{id}", "POST /v1/y"})
	require.Empty(t, r.errs)

	d.CheckRoutes(r, []string{"GET /v1/x/{id}", "DELETE /v1/x/{id}"})
	require.Equal(t, []string{"served but not in the OpenAPI document: DELETE /v1/x/{id}",
		"in the OpenAPI document but not served: POST /v1/y"}, r.errs)
}

func TestCheckExamplesFindsAnExampleOffItsSchema(t *testing.T) {
	d := Load(t, []byte(doc))
	r := &recorder{TB: t}
	require.Equal(t, 2, d.CheckExamples(r))
	require.Len(t, r.errs, 1)
	require.Contains(t, r.errs[0], "POST /v1/y application/json example 0 does not match its schema")
}

func TestParseRefusesAnInvalidDocument(t *testing.T) {
	for name, bad := range map[string]string{
		"3.0":                          `{"openapi":"3.0.3","info":{"title":"t","version":"1"},"paths":{}}`,
		"response without description": `{"openapi":"3.1.0","info":{"title":"t","version":"1"},"paths":{"/a":{"get":{"responses":{"200":{}}}}}}`,
		"undefined scheme":             `{"openapi":"3.1.0","info":{"title":"t","version":"1"},"security":[{"bearer":[]}],"paths":{}}`,
	} {
		_, err := Parse([]byte(bad))
		require.Error(t, err, name)
	}
}
