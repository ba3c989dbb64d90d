package chaos

import (
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestNormalAgainAndBusiestCause(t *testing.T) {
	t0 := time.Unix(1000, 0)
	var checks []Check
	for i := range 40 { // every 100 ms: degraded from 0.5 s to 1.5 s, one stray at 3.5 s
		at := t0.Add(time.Duration(i) * 100 * time.Millisecond)
		deg := at.Sub(t0) >= 500*time.Millisecond && at.Sub(t0) < 1500*time.Millisecond || at.Sub(t0) == 3500*time.Millisecond
		checks = append(checks, Check{Start: at, OK: true, Degraded: deg})
	}
	require.Equal(t, t0.Add(1500*time.Millisecond), normalAgain(checks, t0.Add(400*time.Millisecond), time.Second))
	require.True(t, normalAgain(checks[:20], t0.Add(400*time.Millisecond), time.Second).IsZero(), "never a whole second")

	line := func(at time.Duration, msg, shard string) logLine {
		return logLine{at: t0.Add(at), raw: map[string]any{"msg": msg, "shard": shard}}
	}
	ls := logLines{line(0, "redis call failed", "redis"), line(9*time.Second, "redis call failed", "other"),
		line(11*time.Second, "redis call failed", "redis"), line(12*time.Second, "redis call failed", "other")}
	c, n := ls.busiestCause(10 * time.Second)
	require.Equal(t, 2, n)
	require.Equal(t, "redis call failed | other", c)
}
