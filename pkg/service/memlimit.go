package service

import (
	"errors"
	"fmt"
	"log/slog"
	"math"
	"os"
	"path/filepath"
	"runtime/debug"
	"strconv"
	"strings"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// MemoryLimitRatio is the share of the cgroup's memory limit given to the Go
// heap as its soft limit (GOMEMLIMIT); the rest is for stacks, buffers and
// what the runtime does not count.
const MemoryLimitRatio = 0.9

// SetMemoryLimit sets the Go memory limit to MemoryLimitRatio of the
// cgroup's limit (cgroup v2 memory.max, or v1 memory.limit_in_bytes under
// root), unless GOMEMLIMIT is set — the runtime has read it already. It
// returns the limit set (0: none) and logs what it did.
func SetMemoryLimit(getenv config.Getenv, root string, log *slog.Logger) int64 {
	if getenv("GOMEMLIMIT") != "" {
		log.Debug("memory limit from GOMEMLIMIT", "limit", getenv("GOMEMLIMIT"))
		return 0
	}
	limit, err := CgroupMemoryLimit(root)
	if err != nil {
		log.Debug("no cgroup memory limit; GOMEMLIMIT unset", "err", err)
		return 0
	}
	set := int64(float64(limit) * MemoryLimitRatio)
	debug.SetMemoryLimit(set)
	log.Info("memory limit from cgroup", "cgroup_limit_bytes", limit, "gomemlimit_bytes", set)
	return set
}

// ErrNoMemoryLimit: the cgroup sets no memory limit (or there is no cgroup).
var ErrNoMemoryLimit = errors.New("no cgroup memory limit")

// CgroupMemoryLimit reads the process's cgroup memory limit under root
// (/sys/fs/cgroup): cgroup v2's memory.max, else v1's
// memory/memory.limit_in_bytes. "max" and v1's near-MaxInt64 mean none.
func CgroupMemoryLimit(root string) (int64, error) {
	for _, f := range []string{filepath.Join(root, "memory.max"), filepath.Join(root, "memory", "memory.limit_in_bytes")} {
		b, err := os.ReadFile(f)
		if errors.Is(err, os.ErrNotExist) {
			continue
		}
		if err != nil {
			return 0, fmt.Errorf("read %s: %w", f, err)
		}
		v := strings.TrimSpace(string(b))
		if v == "max" {
			return 0, ErrNoMemoryLimit
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n <= 0 {
			return 0, fmt.Errorf("%s: %q is not a byte count", f, v)
		}
		if n >= math.MaxInt64/2 { // v1 writes 9223372036854771712 for "no limit"
			return 0, ErrNoMemoryLimit
		}
		return n, nil
	}
	return 0, ErrNoMemoryLimit
}
