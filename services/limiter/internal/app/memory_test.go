package app

import (
	"log/slog"
	"math"
	"runtime/debug"
	"testing"

	"github.com/stretchr/testify/require"
)

// The limiter's memory defaults: a soft limit when nothing else gives one,
// never over an explicit GOMEMLIMIT or a cgroup's limit.
func TestMemoryDefaults(t *testing.T) {
	oldLimit, oldGC := debug.SetMemoryLimit(-1), debug.SetGCPercent(100)
	t.Cleanup(func() { debug.SetMemoryLimit(oldLimit); debug.SetGCPercent(oldGC) })
	log := slog.New(slog.DiscardHandler)
	env := func(kv ...string) func(string) string {
		return func(k string) string {
			for i := 0; i+1 < len(kv); i += 2 {
				if kv[i] == k {
					return kv[i+1]
				}
			}
			return ""
		}
	}

	debug.SetMemoryLimit(math.MaxInt64)
	setMemoryDefaults(env(), log)
	require.Equal(t, int64(defaultMemoryLimit), debug.SetMemoryLimit(-1), "no limit in force: the default")
	require.Equal(t, defaultGCPercent, debug.SetGCPercent(100))

	debug.SetMemoryLimit(1 << 30) // as service.Main sets it from a cgroup
	setMemoryDefaults(env(), log)
	require.Equal(t, int64(1<<30), debug.SetMemoryLimit(-1), "the cgroup's limit stands")

	debug.SetMemoryLimit(math.MaxInt64) // GOMEMLIMIT=off, as the runtime read it
	debug.SetGCPercent(100)
	setMemoryDefaults(env("GOMEMLIMIT", "off", "GOGC", "100"), log)
	require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "an explicit GOMEMLIMIT stands")
	require.Equal(t, 100, debug.SetGCPercent(100), "an explicit GOGC stands")
}
