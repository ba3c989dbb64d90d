package config

import (
	"context"
	"log/slog"
	"math"
	"runtime/debug"
	"sync/atomic"
	"testing"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
	"github.com/stretchr/testify/require"
)

// cgroup is a memory limit provider a test changes: 0 = no limit.
type cgroup struct {
	limit atomic.Uint64
	reads atomic.Int64
}

func (c *cgroup) provider() (uint64, error) {
	c.reads.Add(1)
	if l := c.limit.Load(); l != 0 {
		return l, nil
	}
	return 0, memlimit.ErrNoLimit
}

// refreshed sends one tick and waits until the refresh it starts is done:
// the loop takes the second tick only after the first refresh returned.
func refreshed(t *testing.T, ticks chan time.Time) {
	t.Helper()
	for range 2 {
		select {
		case ticks <- time.Now():
		case <-time.After(5 * time.Second):
			t.Fatal("the refresh loop did not take a tick")
		}
	}
}

func TestSetMemoryLimitFollowsTheCgroup(t *testing.T) {
	before := debug.SetMemoryLimit(-1)
	t.Cleanup(func() { debug.SetMemoryLimit(before) })
	log := slog.New(slog.DiscardHandler)
	ratio := MemoryRatio

	t.Run("a cgroup limit, resized, then gone", func(t *testing.T) {
		debug.SetMemoryLimit(math.MaxInt64)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cg, ticks := &cgroup{}, make(chan time.Time)
		cg.limit.Store(512 << 20)
		got := setMemoryLimit(ctx, log, cg.provider, ticks)
		require.Equal(t, int64(float64(512<<20)*ratio), got, "90 % of a 512 MiB container")
		require.Equal(t, got, debug.SetMemoryLimit(-1), "the runtime's limit")

		cg.limit.Store(1 << 30)
		refreshed(t, ticks)
		require.Equal(t, int64(float64(1<<30)*ratio), debug.SetMemoryLimit(-1), "an in-place resize is followed")

		cg.limit.Store(0)
		refreshed(t, ticks)
		require.Equal(t, int64(math.MaxInt64), debug.SetMemoryLimit(-1), "a vanished cgroup limit gives way to the limit before it")
	})

	t.Run("no cgroup limit: a service's own default stays", func(t *testing.T) {
		debug.SetMemoryLimit(math.MaxInt64)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cg, ticks := &cgroup{}, make(chan time.Time)
		require.Equal(t, int64(math.MaxInt64), setMemoryLimit(ctx, log, cg.provider, ticks))
		debug.SetMemoryLimit(300 << 20) // the limiter's default, set after service.Exec's call
		for range 3 {
			refreshed(t, ticks) // a minute each in a service
		}
		require.GreaterOrEqual(t, cg.reads.Load(), int64(1+5), "every refresh read the cgroup (the last may still be running)")
		require.Equal(t, int64(300<<20), debug.SetMemoryLimit(-1), "issue 38: not reset to unlimited")
	})

	t.Run("an explicit GOMEMLIMIT wins and is not followed", func(t *testing.T) {
		debug.SetMemoryLimit(math.MaxInt64)
		t.Setenv("GOMEMLIMIT", "300MiB")
		cg, ticks := &cgroup{}, make(chan time.Time)
		cg.limit.Store(512 << 20)
		require.Equal(t, int64(math.MaxInt64), setMemoryLimit(context.Background(), log, cg.provider, ticks),
			"the runtime read GOMEMLIMIT at start")
		require.Zero(t, cg.reads.Load())
	})

	t.Run("AUTOMEMLIMIT sets the ratio", func(t *testing.T) {
		debug.SetMemoryLimit(math.MaxInt64)
		t.Setenv("AUTOMEMLIMIT", "0.5")
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		cg := &cgroup{}
		cg.limit.Store(512 << 20)
		require.Equal(t, int64(256<<20), setMemoryLimit(ctx, log, cg.provider, make(chan time.Time)))
	})
}
