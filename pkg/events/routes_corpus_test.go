package events

import (
	"os"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events/eventstest"
)

// routeCorpus is the route templates of real public APIs
// (testdata/routes/*.txt, each file naming its source) by file.
func routeCorpus(t testing.TB) map[string][]string {
	out := map[string][]string{}
	for api, lines := range eventstest.RouteCorpus(t) {
		for _, line := range lines {
			fields := strings.Fields(line)
			require.Len(t, fields, 2, "%s: %q", api, line)
			out[api] = append(out[api], fields[1])
		}
	}
	return out
}

// TestRouteCorpus: every route template of the real APIs in testdata/routes
// is valid for the Go validator and for the JSON Schema pattern alike.
func TestRouteCorpus(t *testing.T) {
	t.Parallel()
	re := schemaPattern(t, "route")
	corpus := routeCorpus(t)
	total := 0
	for api, routes := range corpus {
		for _, r := range routes {
			require.NoError(t, ValidRoute(r), "%s: %s", api, r)
			require.True(t, re.MatchString(r), "%s: the schema pattern refuses %s", api, r)
			total++
		}
	}
	require.GreaterOrEqual(t, len(corpus), 5, "APIs in the corpus")
	require.GreaterOrEqual(t, total, 200, "templates in the corpus")
}

// TestRouteCorpusInvalid: bad routes are refused by both, with a clear reason.
func TestRouteCorpusInvalid(t *testing.T) {
	t.Parallel()
	re := schemaPattern(t, "route")
	b, err := os.ReadFile("testdata/routes/invalid.txt")
	require.NoError(t, err)
	n := 0
	for _, line := range strings.Split(string(b), "\n") {
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		route, want, ok := strings.Cut(line, " => ")
		require.True(t, ok, line)
		err := ValidRoute(route)
		require.ErrorIs(t, err, ErrInvalid, route)
		require.Contains(t, err.Error(), want, route)
		require.False(t, re.MatchString(route), "the schema pattern accepts %s", route)
		n++
	}
	require.Greater(t, n, 10)
}
