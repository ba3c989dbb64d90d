package config

import (
	"context"
	"log/slog"
	"math"
	"runtime/debug"
	"testing"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/stretchr/testify/require"
)

func TestSetMemoryLimitFollowsTheCgroup(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)

	ratio := MemoryRatio
	got := setMemoryLimit(ctx, slog.New(slog.DiscardHandler), memlimit.Limit(512<<20))
	require.Equal(t, int64(float64(512<<20)*ratio), got, "90 % of a 512 MiB container")
	require.Equal(t, got, debug.SetMemoryLimit(-1), "the runtime's limit")

	debug.SetMemoryLimit(math.MaxInt64)
	t.Setenv("GOMEMLIMIT", "300MiB")
	require.Equal(t, int64(math.MaxInt64), setMemoryLimit(ctx, slog.New(slog.DiscardHandler), memlimit.Limit(512<<20)),
		"an explicit GOMEMLIMIT wins (the runtime read it at start)")
}
