package settings

import (
	"context"
	"errors"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
)

type getter struct {
	s     Settings
	found bool
	err   error
}

func (g getter) Get(context.Context) (Settings, bool, error) { return g.s, g.found, g.err }

func TestCurrent(t *testing.T) {
	ctx := context.Background()
	defaults := control.Defaults()

	s, err := Current(ctx, getter{}, defaults)
	require.NoError(t, err)
	require.Zero(t, s.Version, "nothing stored: the defaults at version 0")
	require.Equal(t, defaults, s.Rules)
	require.NotNil(t, s.Overrides)
	s.Rules.CPUHigh.Scopes[0] = "tier:ip"
	require.Equal(t, []string{"global"}, defaults.CPUHigh.Scopes, "the defaults are copied, not shared")

	stored := Settings{Version: 4, DryRun: true, Rules: defaults.Clone(),
		Overrides: map[string]Override{"global": {Scale: 0.5, ExpiresAt: time.Unix(2e9, 0)}}}
	s, err = Current(ctx, getter{s: stored, found: true}, defaults)
	require.NoError(t, err)
	require.Equal(t, stored, s)

	s, err = Current(ctx, getter{s: Settings{Version: 2, Rules: defaults.Clone()}, found: true}, defaults)
	require.NoError(t, err)
	require.EqualValues(t, 2, s.Version)
	require.NotNil(t, s.Overrides, "stored without overrides: an empty map")

	_, err = Current(ctx, getter{err: errors.New("dynamodb: throttled")}, defaults)
	require.EqualError(t, err, "dynamodb: throttled")
}
