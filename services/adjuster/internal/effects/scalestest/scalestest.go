// Package scalestest is the exported contract suite of the adjuster's limit
// scales port, run against the Redis scales and the in-memory double alike.
package scalestest

import (
	"context"
	"testing"

	"github.com/stretchr/testify/require"
)

// Scales is the loop's Scales port.
type Scales interface {
	Load(context.Context) (map[string]float64, error)
	Set(context.Context, map[string]float64) error
}

// Run is what the loop relies on from every Scales; open returns an empty one.
func Run(t *testing.T, open func(t *testing.T) Scales) {
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
}
