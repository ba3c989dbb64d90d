package config

import (
	"context"
	"log/slog"
	"math"
	"os"
	"runtime/debug"
	"strconv"
	"time"

	"github.com/KimMachineGun/automemlimit/memlimit"
)

// MemoryRatio is the share of the container's memory limit given to the Go
// heap's soft limit: the rest is for goroutine stacks, buffers outside the
// heap and the kernel's page cache of the process. AUTOMEMLIMIT=<ratio>
// overrides it.
const MemoryRatio = 0.9

// MemoryRefresh is how often SetMemoryLimit reads the cgroup's limit again.
const MemoryRefresh = time.Minute

// SetMemoryLimit sets the Go runtime's soft memory limit (GOMEMLIMIT) to
// MemoryRatio of the cgroup's memory limit, and follows changes of that limit
// (an in-place resize) every MemoryRefresh until ctx ends. Under memory
// pressure the garbage collector then works harder before the kernel's OOM
// killer acts. An explicit GOMEMLIMIT (or AUTOMEMLIMIT=off) wins and nothing
// is followed. Without a cgroup limit (a developer's machine) the limit in
// force stands — the runtime's, or a service's own default set after this
// (the limiter's 300 MiB): a refresh never replaces a limit it did not set
// with "unlimited" (issue 38: automemlimit's own refresh did, 60 s after
// every start). A cgroup limit that goes away gives way to the limit in force
// before it. It returns the limit in force and logs it when it comes from the
// cgroup.
func SetMemoryLimit(ctx context.Context, log *slog.Logger) int64 {
	t := time.NewTicker(MemoryRefresh)
	go func() { <-ctx.Done(); t.Stop() }()
	return setMemoryLimit(ctx, log, memlimit.FromCgroup, t.C)
}

// setMemoryLimit is SetMemoryLimit reading the limit from `from` at start and
// at every tick of refresh.
func setMemoryLimit(ctx context.Context, log *slog.Logger, from memlimit.Provider, refresh <-chan time.Time) int64 {
	if v, ok := os.LookupEnv("GOMEMLIMIT"); ok {
		log.Debug("memory limit: GOMEMLIMIT is set", "gomemlimit", v)
		return debug.SetMemoryLimit(-1)
	}
	ratio := MemoryRatio
	if v, ok := os.LookupEnv("AUTOMEMLIMIT"); ok {
		r, err := strconv.ParseFloat(v, 64)
		if v == "off" || err != nil || !(r > 0 && r <= 1) {
			if v != "off" {
				log.Warn("memory limit: AUTOMEMLIMIT is not off or a ratio in (0, 1]; not following the cgroup", "automemlimit", v)
			}
			return debug.SetMemoryLimit(-1)
		}
		ratio = r
	}
	f := &memFollower{from: from, ratio: ratio, log: log}
	limit := f.refresh()
	go func() {
		for {
			select {
			case <-ctx.Done():
				return
			case <-refresh:
				f.refresh()
			}
		}
	}()
	return limit
}

// memFollower keeps the runtime's memory limit at ratio of the cgroup's.
// Used by one goroutine at a time.
type memFollower struct {
	from    memlimit.Provider
	ratio   float64
	log     *slog.Logger
	applied int64 // the limit it set last from the cgroup; 0: none in force
	before  int64 // the limit in force before applied
}

// refresh reads the cgroup's limit and applies it; it returns the limit in force.
func (f *memFollower) refresh() int64 {
	cur := debug.SetMemoryLimit(-1)
	raw, err := f.from()
	if err == nil && float64(raw)*f.ratio >= math.MaxInt64 {
		err = memlimit.ErrNoLimit
	}
	if err != nil {
		// No cgroup limit, or none readable: the limit in force stands,
		// unless it is one this follower set and the cgroup's limit is gone.
		if f.applied != 0 && cur == f.applied {
			debug.SetMemoryLimit(f.before)
			f.log.Info("memory limit", "gomemlimit_bytes", f.before, "previous", cur, "from", "the limit before the cgroup's (the cgroup has no limit now)")
			f.applied = 0
			return f.before
		}
		f.applied = 0
		f.log.Debug("memory limit: none from the cgroup", "reason", err.Error(), "gomemlimit_bytes", cur)
		return cur
	}
	want := int64(float64(raw) * f.ratio)
	if f.applied == 0 || cur != f.applied {
		f.before = cur // set by someone else since: what a vanished cgroup limit gives way to
	}
	f.applied = want
	if want != cur {
		debug.SetMemoryLimit(want)
		f.log.Info("memory limit", "gomemlimit_bytes", want, "previous", cur, "from", "the cgroup", "ratio", f.ratio)
	}
	return want
}
