package chaos

// Where a scenario's processes run: their cores (pin), CPU weight and
// quota (FavourCPU, LimitCPU), and how fast and how loaded the cores are
// (coreProbe, loadAverage).

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cgroup"
	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
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

// pin sets the CPU affinity of every thread of pid (taskset -a -p -c cpus).
func pin(pid int, cpus string) error {
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset -c %s %d: %w: %s", cpus, pid, err, out)
	}
	return nil
}

// coreProbe is a speed probe of core 1, the limiter's (cputime.Probe):
// this machine's cores run faster or slower from one minute to the next,
// and a phase's answers within the deadline move with them.
func coreProbe(ctx context.Context) string {
	wall, cpu, err := cputime.Probe(ctx, "1")
	if err != nil {
		return err.Error()
	}
	return fmt.Sprintf("sha256 of 64 MiB in %s (%s of CPU)", ms(wall), ms(cpu))
}

// loadAverage is the 1-, 5- and 15-minute load average.
func loadAverage() string {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return "unknown"
	}
	f := strings.Fields(string(b))
	if len(f) < 3 {
		return "unknown"
	}
	return strings.Join(f[:3], " ")
}

// renice sets the nice value of every thread of pid (threads it starts
// later inherit it from the thread that starts them).
func renice(pid, nice int) error {
	tasks, err := os.ReadDir("/proc/" + strconv.Itoa(pid) + "/task")
	if err != nil {
		return err
	}
	for _, t := range tasks {
		tid, err := strconv.Atoi(t.Name())
		if err != nil {
			continue
		}
		if err := syscall.Setpriority(syscall.PRIO_PROCESS, tid, nice); err != nil {
			return fmt.Errorf("nice %d for thread %d of %d: %w", nice, tid, pid, err)
		}
	}
	return nil
}
