package events

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/events/internal/eventgen"
	"github.com/stretchr/testify/require"
)

// TestGeneratedCodeIsFresh regenerates the codec from the schemas in memory
// and compares it with the committed *_gen.go files: a schema edited without
// `go generate ./pkg/events` (or a generated file edited by hand) fails here.
func TestGeneratedCodeIsFresh(t *testing.T) {
	t.Parallel()
	want, err := eventgen.Generate(schemasDir)
	require.NoError(t, err)
	require.NotEmpty(t, want)
	for name, src := range want {
		got, err := os.ReadFile(name)
		require.NoError(t, err, "%s is missing: run go generate ./pkg/events", name)
		if line, ok := firstDiff(string(src), string(got)); !ok {
			t.Errorf("%s is stale: run go generate ./pkg/events (line %d differs)", name, line)
		}
	}
	committed, err := filepath.Glob("*_gen.go")
	require.NoError(t, err)
	for _, name := range committed {
		require.Contains(t, want, name, "%s is generated from no schema: run go generate ./pkg/events", name)
	}
}

// firstDiff returns the first line (from 1) where a and b differ; ok when
// they are equal.
func firstDiff(a, b string) (line int, ok bool) {
	if a == b {
		return 0, true
	}
	al, bl := strings.Split(a, "\n"), strings.Split(b, "\n")
	for i := range min(len(al), len(bl)) {
		if al[i] != bl[i] {
			return i + 1, false
		}
	}
	return min(len(al), len(bl)) + 1, false
}
