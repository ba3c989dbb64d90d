package envoypeer

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestFloodgateLoadsWhatEnvoyRatelimitLoads asks envoy ratelimit's own
// configuration checker (config_check_cmd of the pinned build, which loads
// a directory as the service does) and Floodgate's loader about the same
// directories, and requires the same verdict: a directory with floodgate
// comments loads in both, unchanged; a key envoy ratelimit refuses
// (metadata, floodgate as a key, a float value) is refused by both.
func TestFloodgateLoadsWhatEnvoyRatelimitLoads(t *testing.T) {
	ctx := stacktest.Context(t, 5*time.Minute, "builds envoy ratelimit's configuration checker")
	root := stacktest.Root(t)
	bin, err := InstallCheck(ctx, filepath.Join(root, ".local", "bin"))
	require.NoError(t, err)

	const ok = "domain: d\ndescriptors:\n  - key: k\n"
	cases := []struct {
		name  string
		files map[string]string
		loads bool
	}{
		{"floodgate comments on every kind of line", map[string]string{"a.yaml": `domain: d
descriptors:
  # floodgate: {fail: open}
  - key: a
    rate_limit: {unit: second, requests_per_unit: 1}
  - key: b # floodgate: {algorithm: token_bucket, burst: 2}
    rate_limit:
      unit: minute
      requests_per_unit: 1
  - key: c
    # floodgate: {algorithm: gcra, burst: 3, fail: closed}
    rate_limit: {unit: hour, requests_per_unit: 1}
    descriptors:
      - key: d
        rate_limit: {unit: day, requests_per_unit: 1} # floodgate: {algorithm: sliding_window_log}
`}, true},
		{"metadata", map[string]string{"a.yaml": ok + "    metadata: {team: x}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"}, false},
		{"floodgate as a key", map[string]string{"a.yaml": ok + "    floodgate: {algorithm: gcra}\n"}, false},
		{"a float value", map[string]string{"a.yaml": ok + "    value: 2.5\n"}, false},
		{"an unknown key", map[string]string{"a.yaml": ok + "    limit: 5\n"}, false},
		{"integer and boolean values", map[string]string{"a.yaml": ok + "    value: 25\n  - key: b\n    value: false\n"}, true},
	}
	testdata := map[string]string{}
	entries, err := os.ReadDir(filepath.Join(root, "pkg", "envoyconf", "testdata"))
	require.NoError(t, err)
	for _, e := range entries {
		b, err := os.ReadFile(filepath.Join(root, "pkg", "envoyconf", "testdata", e.Name()))
		require.NoError(t, err)
		testdata[e.Name()] = string(b)
	}
	cases = append(cases, struct {
		name  string
		files map[string]string
		loads bool
	}{"the differential test's directory (floodgate comments included)", testdata, true})

	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			dir := t.TempDir()
			for n, s := range tc.files {
				require.NoError(t, os.WriteFile(filepath.Join(dir, n), []byte(s), 0o644))
			}
			peerErr := Check(ctx, bin, dir)
			_, fgErr := envoyconf.LoadDir(dir, envoyconf.Options{})
			if tc.loads {
				require.NoError(t, peerErr, "envoy ratelimit")
				require.NoError(t, fgErr, "Floodgate")
				return
			}
			require.Error(t, peerErr, "envoy ratelimit loads it")
			require.Error(t, fgErr, "Floodgate loads what envoy ratelimit refuses")
			require.Regexp(t, `a\.yaml:\d+: `, fgErr.Error(), "Floodgate names the file and line")
		})
	}
}
