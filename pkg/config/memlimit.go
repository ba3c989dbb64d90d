package config

import (
	"context"
	"log/slog"
	"math"
	"runtime/debug"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// MemoryRatio is the share of the container's memory limit given to the Go
// heap's soft limit: the rest is for goroutine stacks, buffers outside the
// heap and the kernel's page cache of the process.
const MemoryRatio = 0.9

// SetMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) to
// MemoryRatio of the cgroup's memory limit, and follows changes of that limit
// (an in-place resize) every minute until ctx ends. Under memory pressure the
// garbage collector then works harder before the kernel's OOM killer acts.
// An explicit GOMEMLIMIT (or AUTOMEMLIMIT=off) wins; without a cgroup limit
// (a developer's machine) the runtime's default stands. It returns the limit
// in force and logs it once when there is one.
func SetMemoryLimit(ctx context.Context, log *slog.Logger) int64 {
	return setMemoryLimit(ctx, log, memlimit.FromCgroup)
}

func setMemoryLimit(ctx context.Context, log *slog.Logger, from memlimit.Provider) int64 {
	limit, err := memlimit.Set(memlimit.WithProvider(from), memlimit.WithRatio(MemoryRatio),
		memlimit.WithRefreshInterval(ctx, time.Minute), memlimit.WithLogger(log))
	if err != nil {
		// Outside a cgroup with a memory controller: keep the default.
		log.Debug("memory limit: none from the cgroup", "reason", err.Error())
		return debug.SetMemoryLimit(-1)
	}
	if limit < math.MaxInt64 {
		log.Info("memory limit", "gomemlimit_bytes", limit)
	}
	return limit
}
