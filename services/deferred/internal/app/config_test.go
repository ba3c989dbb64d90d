package app

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConfigNamesTheVariable(t *testing.T) {
	good := map[string]string{"FLOODGATE_DEFERRED_UPSTREAM": "http://127.0.0.1:9000", "FLOODGATE_DEFERRED_SIGNING_KEY": strings.Repeat("k", 32)}
	env := func(over map[string]string) func(string) string {
		return func(k string) string {
			if v, ok := over[k]; ok {
				return v
			}
			return good[k]
		}
	}
	c, err := ConfigFromEnv(env(nil))
	require.NoError(t, err)
	require.Equal(t, "floodgate.deferred.v1", c.Topic)
	require.Equal(t, DefaultAddr, c.HTTPAddr)
	for name, bad := range map[string]string{
		"FLOODGATE_DEFERRED_UPSTREAM":         "",
		"FLOODGATE_DEFERRED_SIGNING_KEY":      "short",
		"FLOODGATE_DEFERRED_TOPIC":            "a b",
		"FLOODGATE_DEFERRED_RESULT_TTL":       "1s",
		"FLOODGATE_DEFERRED_RESULT_HEADERS":   "Set-Cookie",
		"FLOODGATE_DEFERRED_LIMITER_URL":      "ftp://x",
		"FLOODGATE_DEFERRED_UPSTREAM_TIMEOUT": "forever",
	} {
		t.Run(name, func(t *testing.T) {
			_, err := ConfigFromEnv(env(map[string]string{name: bad}))
			require.ErrorContains(t, err, name)
		})
	}
}
