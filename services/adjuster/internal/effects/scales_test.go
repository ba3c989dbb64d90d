package effects

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// scales is the loop's Scales port.
type scales interface {
	Load(context.Context) (map[string]float64, error)
	Set(context.Context, map[string]float64) error
}

// TestScalesContract runs what the loop relies on against both Scales: the
// one in Redis and the in-memory double its tests use.
func TestScalesContract(t *testing.T) {
	for name, open := range map[string]func(t *testing.T) scales{
		"redis": func(t *testing.T) scales {
			return &RedisScales{Client: redistest.Client(t), Key: redistest.Unique(t, "fg:test:scales")}
		},
		"memory": func(*testing.T) scales { return &MemScales{} },
	} {
		t.Run(name, func(t *testing.T) {
			ctx := context.Background()
			s := open(t)
			got, err := s.Load(ctx)
			require.NoError(t, err)
			require.Empty(t, got, "nothing set yet")

			require.NoError(t, s.Set(ctx, map[string]float64{"global": 0.7, "tier:ip": 0.5}))
			require.NoError(t, s.Set(ctx, map[string]float64{"tier:ip": 0.35}))
			require.NoError(t, s.Set(ctx, nil))
			got, err = s.Load(ctx)
			require.NoError(t, err)
			require.Equal(t, map[string]float64{"global": 0.7, "tier:ip": 0.35}, got, "a Set adds to the scales, replacing its scopes'")

			got["global"] = 9
			again, err := s.Load(ctx)
			require.NoError(t, err)
			require.Equal(t, 0.7, again["global"], "the caller owns the map Load returns")
		})
	}
}
