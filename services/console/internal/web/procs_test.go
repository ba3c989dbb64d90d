package web

import (
	"os"
	"path/filepath"
	"sync"
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/stretchr/testify/require"
)

// Other services run as real processes (services never import each other):
// their binaries are built once per test binary run.
var (
	buildOnce sync.Once
	binDir    string
	buildErr  error
	buildOut  []byte
)

func serviceBinary(t *testing.T, name string) string {
	t.Helper()
	buildOnce.Do(func() {
		if binDir, buildErr = os.MkdirTemp("", "console-test-bin-"); buildErr == nil {
			buildOut, buildErr = stacktest.GoBuild(binDir, "quota", "adjuster", "dlq-auditor")
		}
	})
	require.NoError(t, buildErr, "go build: %s", buildOut)
	return filepath.Join(binDir, name)
}

func TestMain(m *testing.M) {
	code := m.Run()
	if binDir != "" {
		_ = os.RemoveAll(binDir)
	}
	os.Exit(code)
}
