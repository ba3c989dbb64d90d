// Package eventstest gives other packages' tests the corpus of real public
// API route templates in pkg/events/testdata/routes, which the event
// schema's route pattern, the Go validator and the gateway's router are all
// tested against.
package eventstest

import (
	"bufio"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// RouteCorpus returns the corpus by API (the file's name, e.g.
// "github.txt"): each template as its line, "METHOD /template". Blank lines
// and # comments are left out; invalid.txt, the routes that must be refused,
// is not part of it.
func RouteCorpus(t testing.TB) map[string][]string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	require.True(t, ok, "no caller information to find testdata/routes")
	files, err := filepath.Glob(filepath.Join(filepath.Dir(self), "..", "testdata", "routes", "*.txt"))
	require.NoError(t, err)
	require.NotEmpty(t, files, "no route corpus")
	out := map[string][]string{}
	for _, f := range files {
		api := filepath.Base(f)
		if api == "invalid.txt" {
			continue
		}
		fh, err := os.Open(f)
		require.NoError(t, err)
		sc := bufio.NewScanner(fh)
		for sc.Scan() {
			line := strings.TrimSpace(sc.Text())
			if line == "" || strings.HasPrefix(line, "#") {
				continue
			}
			out[api] = append(out[api], line)
		}
		require.NoError(t, sc.Err())
		require.NoError(t, fh.Close())
	}
	return out
}
