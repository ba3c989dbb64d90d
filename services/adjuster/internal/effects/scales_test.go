package effects

import (
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/effects/scalestest"
)

// TestScalesContract runs what the loop relies on against both Scales: the
// one in Redis and the in-memory double its tests use.
func TestScalesContract(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) scalestest.Scales{
		"redis": func(t *testing.T) scalestest.Scales {
			return &RedisScales{Client: redistest.Client(t), Key: redistest.Unique(t, "fg:test:scales")}
		},
		"memory": func(*testing.T) scalestest.Scales { return &MemScales{} },
	} {
		t.Run(name, func(t *testing.T) { scalestest.Run(t, open) })
	}
}
