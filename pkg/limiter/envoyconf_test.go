package limiter

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
)

// Every algorithm a floodgate comment may name is one the check script runs.
func TestEnvoyAlgorithmsAreTheScripts(t *testing.T) {
	for _, a := range envoyconf.Algorithms {
		if a.Floodgate() {
			require.NotEmpty(t, Algorithm(a).code(), a)
			require.Equal(t, Algorithm(a).hasBurst(), a.HasBurst(), a)
		}
	}
	require.Equal(t, maxLogLimit, envoyconf.MaxSlidingLogLimit)
}
