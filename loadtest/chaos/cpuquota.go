package chaos

import (
	"fmt"
	"os"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cgroup"
)

// CPUQuota is a cgroup of the highest CPU weight holding a scenario's
// processes, with a CPU bandwidth limit when LimitCPU made it
// (loadtest/internal/cgroup, which peerbench shares).
type CPUQuota = cgroup.Group

// LimitCPU puts pid into a new cgroup limited to cores of CPU time per
// period (cgroup.Limit). A short period (overload uses 4 ms) keeps a throttled process's
// stall short; the error says why when the machine has no writable cpu
// controller.
func LimitCPU(pid int, cores float64, period time.Duration) (*CPUQuota, error) {
	return cgroup.Limit(fmt.Sprintf("floodgate-chaos-%d", pid), pid, cores, period)
}

// FavourCPU puts pids into a new cgroup of the highest CPU weight and no
// quota (cgroup.Favour): the scenario's own processes (the load generator,
// Redis, the broker) keep their core whatever else the machine runs.
func FavourCPU(pids ...int) (*CPUQuota, error) {
	return cgroup.Favour(fmt.Sprintf("floodgate-chaos-favoured-%d", os.Getpid()), pids...)
}
