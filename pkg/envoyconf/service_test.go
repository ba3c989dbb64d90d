package envoyconf

import (
	"log/slog"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSourceKeepsTheConfigurationOnAnInvalidEdit edits a configuration
// directory the way an operator does: a new file is picked up, a broken one
// keeps what is in force, and a fixed one is picked up again.
func TestSourceKeepsTheConfigurationOnAnInvalidEdit(t *testing.T) {
	dir := t.TempDir()
	write := func(name, s string) { require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(s), 0o600)) }
	write("a.yaml", "domain: a\ndescriptors:\n  - key: user\n    rate_limit: {unit: second, requests_per_unit: 10}\n")
	_, err := OpenDir(filepath.Join(dir, "missing"), Options{}, slog.New(slog.DiscardHandler))
	require.Error(t, err, "a missing directory fails at start-up")

	src, err := OpenDir(dir, Options{}, slog.New(slog.DiscardHandler))
	require.NoError(t, err)
	require.Equal(t, []string{"a"}, src.Config().Domains())
	changed, err := src.Reload()
	require.NoError(t, err)
	require.False(t, changed, "an unchanged directory is not reloaded")

	write("b.yml", "domain: b\ndescriptors:\n  - key: ip\n    rate_limit: {unit: minute, requests_per_unit: 5}\n")
	changed, err = src.Reload()
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, []string{"a", "b"}, src.Config().Domains())

	write("b.yml", "domain: b\ndescriptors:\n  - key: ip\n    rate_limit: {unit: fortnight, requests_per_unit: 5}\n")
	_, err = src.Reload()
	require.ErrorContains(t, err, "b.yml:", "the rejection names the file")
	require.Equal(t, []string{"a", "b"}, src.Config().Domains(), "an invalid edit keeps the configuration in force")

	require.NoError(t, os.Remove(filepath.Join(dir, "b.yml")))
	changed, err = src.Reload()
	require.NoError(t, err)
	require.True(t, changed)
	require.Equal(t, []string{"a"}, src.Config().Domains())
}
