package openapi_test

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/httpapi/openapitest"
	"github.com/floodgate-dev/floodgate/schemas/openapi"
)

// TestDocumentsAreValidOpenAPI31 bundles every service document and checks
// it against the OpenAPI 3.1 meta-schema, and its request examples against
// their schemas. The routes and real answers are checked by each service's
// own drift test (openapi_test.go beside its handler).
func TestDocumentsAreValidOpenAPI31(t *testing.T) {
	for _, name := range openapi.Names() {
		t.Run(name, func(t *testing.T) {
			b, err := openapi.JSON(name)
			require.NoError(t, err)
			require.NotContains(t, string(b), "common.yaml#", "the bundle is self-contained")
			d := openapitest.Load(t, b)
			require.NotEmpty(t, d.Operations())
			t.Logf("%d request examples checked", d.CheckExamples(t))
		})
	}
}

// TestBundleRejectsBrokenDocuments: a reference to a component common.yaml
// lacks fails the bundle, and an invalid document fails validation.
func TestBundleRejectsBrokenDocuments(t *testing.T) {
	b, err := openapi.JSON(openapi.Limiter)
	require.NoError(t, err)
	var doc map[string]any
	require.NoError(t, json.Unmarshal(b, &doc))
	paths := doc["paths"].(map[string]any)
	op := paths["/v1/check"].(map[string]any)["post"].(map[string]any)
	delete(op, "responses")                                                              // an operation must have responses in 3.1 … or at least one of them
	op["responses"] = map[string]any{"200": map[string]any{"content": map[string]any{}}} // a response needs a description
	broken, err := json.Marshal(doc)
	require.NoError(t, err)
	_, err = openapitest.Parse(broken)
	require.Error(t, err)
	require.Contains(t, err.Error(), "description")

	_, err = openapi.JSON("nope")
	require.Error(t, err)
	require.True(t, strings.Contains(err.Error(), "no document"))
}

// TestBundleResolvesSharedSecuritySchemes: a service document names the
// shared bearer scheme by a $ref to common.yaml (so generators reading the
// repository file see it); the bundle holds the scheme itself.
func TestBundleResolvesSharedSecuritySchemes(t *testing.T) {
	for _, name := range openapi.Names() {
		b, err := openapi.JSON(name)
		require.NoError(t, err)
		var doc struct {
			Components struct {
				SecuritySchemes map[string]map[string]any `json:"securitySchemes"`
			} `json:"components"`
		}
		require.NoError(t, json.Unmarshal(b, &doc))
		bearer := doc.Components.SecuritySchemes["bearer"]
		require.Equal(t, "http", bearer["type"], name)
		require.Equal(t, "bearer", bearer["scheme"], name)
	}
}
