package tick

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestEveryPassesOneAnIntervalAndCountsTheRest(t *testing.T) {
	t.Parallel()
	var e Throttle
	t0 := time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)
	ok, held := e.Pass(t0, time.Minute)
	require.True(t, ok, "the first event goes through")
	require.Zero(t, held)
	for i := range 3 {
		ok, held = e.Pass(t0.Add(time.Duration(i+1)*time.Second), time.Minute)
		require.False(t, ok, "within the interval")
		require.Zero(t, held)
	}
	ok, held = e.Pass(t0.Add(time.Minute), time.Minute)
	require.True(t, ok, "an interval after the last that went through")
	require.EqualValues(t, 3, held)
	ok, held = e.Pass(t0.Add(2*time.Minute), time.Minute)
	require.True(t, ok)
	require.Zero(t, held, "the count starts again")
}
