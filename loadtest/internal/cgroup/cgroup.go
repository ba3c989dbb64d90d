// Package cgroup puts a load test's processes into cgroups of the machine's
// cpu controller: one of the highest CPU weight (Favour), so a measurement's
// own processes keep their cores whatever else a shared machine runs, or one
// with a CPU bandwidth quota besides (Limit).
package cgroup

import (
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"strconv"
	"strings"
	"time"
)

// Group is a cgroup of its own under the machine's cpu controller of the
// highest weight, the processes moved into it, and with Limit a CPU bandwidth
// limit besides (cgroup v1 cpu.cfs_quota_us / cpu.cfs_period_us, or cgroup v2
// cpu.max): a limited process gets its quota whatever else runs beside it.
// A quota lets one load-generator core offer 2× a service's saturation: the
// service's saturation falls with its quota (docs/chaos.md, overload).
type Group struct {
	Cores  float64       // the quota, in cores (0.3: 30 % of one core); 0: none (Favour)
	Period time.Duration // the enforcement period
	dir    string        // the cgroup's directory
	parent string        // where the process was (to move it back)
	v2     bool
}

// cgroupV1CPU and cgroupV2 are where the cpu controller is mounted.
const (
	cgroupV1CPU = "/sys/fs/cgroup/cpu"
	cgroupV2    = "/sys/fs/cgroup"
)

// Limit puts pid into a new cgroup called name limited to cores of CPU time
// per period. A short period (10 ms) keeps a throttled process's stall short: with
// 100 ms, a process at 30 % runs 30 ms and then waits 70 ms — longer than a
// 50 ms caller deadline. The error says why when the machine has no writable
// cpu controller.
func Limit(name string, pid int, cores float64, period time.Duration) (*Group, error) {
	if cores <= 0 || period < time.Millisecond || period > time.Second {
		return nil, fmt.Errorf("cpu quota %.2f cores per %s: want cores > 0 and a period of 1ms..1s", cores, period)
	}
	periodUS := period.Microseconds()
	quotaUS := int64(cores * float64(periodUS))
	if quotaUS < 1000 { // the kernel refuses a quota under 1 ms
		return nil, fmt.Errorf("cpu quota %.2f cores per %s is %d µs, under the kernel's 1 ms floor: want a period of at least %s", cores, period, quotaUS, time.Duration(float64(time.Millisecond)/cores).Round(time.Microsecond))
	}
	q, err := newGroup(name,
		[][2]string{{"cpu.cfs_period_us", strconv.FormatInt(periodUS, 10)}, {"cpu.cfs_quota_us", strconv.FormatInt(quotaUS, 10)}, v1Favoured},
		[][2]string{{"cpu.max", fmt.Sprintf("%d %d", quotaUS, periodUS)}, v2Favoured}, pid)
	if err != nil {
		return nil, err
	}
	q.Cores, q.Period = cores, period
	return q, nil
}

// The highest CPU weight a cgroup can have (v1 cpu.shares, v2 cpu.weight):
// against the machine's other processes (1024 / 100 each) a favoured group
// gets its CPU whenever it is runnable, so other work on a shared machine
// takes only what it leaves.
var (
	v1Favoured = [2]string{"cpu.shares", "262144"}
	v2Favoured = [2]string{"cpu.weight", "10000"}
)

// Favour puts pids into a new cgroup called name of the highest CPU weight
// and no quota: a measurement's own processes (the service under test, the
// load generator, Redis, the broker) keep their core whatever else the
// machine runs. The name must be unique on the machine (a pid in it does).
func Favour(name string, pids ...int) (*Group, error) {
	return newGroup(name, [][2]string{v1Favoured}, [][2]string{v2Favoured}, pids...)
}

// newGroup makes a cgroup named name under the machine's cpu controller
// with the files v1 or v2 (whichever the machine has) and moves pids into it.
func newGroup(name string, v1, v2 [][2]string, pids ...int) (*Group, error) {
	q := &Group{}
	files := v1
	switch {
	case exists(filepath.Join(cgroupV1CPU, "cpu.cfs_quota_us")):
		q.dir, q.parent = filepath.Join(cgroupV1CPU, name), cgroupV1CPU
	case controllerOn(cgroupV2, "cpu"):
		q.v2, q.dir, q.parent, files = true, filepath.Join(cgroupV2, name), cgroupV2, v2
	default:
		return nil, errors.New("no writable cpu controller (neither " + cgroupV1CPU + "/cpu.cfs_quota_us nor cpu in " + cgroupV2 + "/cgroup.subtree_control)")
	}
	if err := os.Mkdir(q.dir, 0o755); err != nil {
		return nil, fmt.Errorf("cgroup: %w", err)
	}
	for _, pid := range pids {
		files = append(files, [2]string{"cgroup.procs", strconv.Itoa(pid)})
	}
	if err := writeFiles(q.dir, files); err != nil {
		_ = q.Remove()
		return nil, err
	}
	return q, nil
}

// String names the quota as the kernel holds it.
func (q *Group) String() string {
	weight := v1Favoured
	if q.v2 {
		weight = v2Favoured
	}
	w := weight[0] + " " + weight[1]
	switch {
	case q.Cores == 0:
		return "cgroup " + w
	case q.v2:
		return fmt.Sprintf("%.2f core (cgroup v2 cpu.max %d %d, %s)", q.Cores, int64(q.Cores*float64(q.Period.Microseconds())), q.Period.Microseconds(), w)
	}
	return fmt.Sprintf("%.2f core (cgroup v1 cpu.cfs_quota_us %d per cpu.cfs_period_us %d, %s)", q.Cores, int64(q.Cores*float64(q.Period.Microseconds())), q.Period.Microseconds(), w)
}

// Throttled is how many periods the process ran out of quota in, and for
// how long it waited in all, so far (cpu.stat).
func (q *Group) Throttled() (periods int64, waited time.Duration) {
	b, err := os.ReadFile(filepath.Join(q.dir, "cpu.stat"))
	if err != nil {
		return 0, 0
	}
	for _, line := range strings.Split(string(b), "\n") {
		k, v, _ := strings.Cut(line, " ")
		n, _ := strconv.ParseInt(v, 10, 64)
		switch k {
		case "nr_throttled":
			periods = n
		case "throttled_time": // v1: ns
			waited = time.Duration(n)
		case "throttled_usec": // v2
			waited = time.Duration(n) * time.Microsecond
		}
	}
	return periods, waited
}

// Add moves pid into the cgroup (out of whichever it was in: a process is
// in one cgroup of a hierarchy).
func (q *Group) Add(pid int) error {
	return writeFiles(q.dir, [][2]string{{"cgroup.procs", strconv.Itoa(pid)}})
}

// Remove moves what is left in the cgroup back to its parent and removes it.
func (q *Group) Remove() error {
	if b, err := os.ReadFile(filepath.Join(q.dir, "cgroup.procs")); err == nil {
		for _, pid := range strings.Fields(string(b)) {
			_ = writeFiles(q.parent, [][2]string{{"cgroup.procs", pid}})
		}
	}
	if err := os.Remove(q.dir); err != nil {
		return fmt.Errorf("remove cgroup: %w", err)
	}
	return nil
}

func writeFiles(dir string, kv [][2]string) error {
	for _, f := range kv {
		if err := os.WriteFile(filepath.Join(dir, f[0]), []byte(f[1]), 0o644); err != nil {
			return fmt.Errorf("write %s: %w", filepath.Join(dir, f[0]), err)
		}
	}
	return nil
}

func exists(path string) bool { _, err := os.Stat(path); return err == nil }

// controllerOn reports whether a cgroup v2 root hands controller down to its
// children.
func controllerOn(root, controller string) bool {
	b, err := os.ReadFile(filepath.Join(root, "cgroup.subtree_control"))
	return err == nil && slices.Contains(strings.Fields(string(b)), controller)
}
