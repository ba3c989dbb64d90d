// Package cputime reads the CPU time processes have spent, for load tests
// that say where a machine's time went (per call, per process).
package cputime

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"syscall"
	"time"
)

// clockTick is the unit of utime and stime in /proc/<pid>/stat (USER_HZ,
// 100 on every Linux architecture Go builds for).
const clockTick = 10 * time.Millisecond

// Of is a process's user plus system CPU time so far, from /proc (10 ms
// resolution); 0 when pid is 0 or the process is gone.
func Of(pid int) time.Duration {
	if pid == 0 {
		return 0
	}
	b, err := os.ReadFile(fmt.Sprintf("/proc/%d/stat", pid))
	if err != nil {
		return 0
	}
	// The name, in parentheses, may hold spaces: fields count from after it.
	s := string(b)
	f := strings.Fields(s[strings.LastIndexByte(s, ')')+1:])
	if len(f) < 13 {
		return 0
	}
	utime, _ := strconv.ParseInt(f[11], 10, 64)
	stime, _ := strconv.ParseInt(f[12], 10, 64)
	return time.Duration(utime+stime) * clockTick
}

// Self is this process's user plus system CPU time so far (getrusage).
func Self() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// Machine is the CPU time every core of the machine has spent busy so far
// (user, nice, system, irq, softirq and steal from /proc/stat; 10 ms
// resolution): its difference over a wall-clock span, divided by the span,
// is how many cores were busy.
func Machine() time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return 0
	}
	line, _, _ := strings.Cut(string(b), "\n")
	f := strings.Fields(line)
	if len(f) < 9 || f[0] != "cpu" {
		return 0
	}
	var busy int64
	for _, i := range []int{1, 2, 3, 6, 7, 8} { // user nice system (idle iowait) irq softirq steal
		v, _ := strconv.ParseInt(f[i], 10, 64)
		busy += v
	}
	return time.Duration(busy) * clockTick
}

// CoreTimes is, per core in /proc/stat's order (cpu0, cpu1, …), its busy
// time (user, nice, system, irq, softirq, steal) and its total time (idle
// and iowait too), in ticks; nil when /proc/stat is unreadable.
func CoreTimes() (busy, total []int64) {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil, nil
	}
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 9 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		var bz, tot int64
		for i := 1; i < len(f) && i <= 8; i++ {
			v, _ := strconv.ParseInt(f[i], 10, 64)
			tot += v
			if i != 4 && i != 5 { // idle, iowait
				bz += v
			}
		}
		busy, total = append(busy, bz), append(total, tot)
	}
	return busy, total
}

// CoreBusy is each core's busy share between two CoreTimes readings (0..1).
func CoreBusy(busy0, total0, busy1, total1 []int64) []float64 {
	out := make([]float64, min(len(busy0), len(busy1)))
	for i := range out {
		if dt := total1[i] - total0[i]; dt > 0 {
			out[i] = float64(busy1[i]-busy0[i]) / float64(dt)
		}
	}
	return out
}

// Profile writes the body of GET url, a pprof endpoint of a process
// (/debug/pprof/profile?seconds=N, …/allocs), to path.
func Profile(ctx context.Context, url, path string) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return fmt.Errorf("profile: %w", err)
	}
	defer func() { _ = resp.Body.Close() }()
	if resp.StatusCode != http.StatusOK {
		return fmt.Errorf("profile %s: status %d", url, resp.StatusCode)
	}
	f, err := os.Create(path)
	if err != nil {
		return err
	}
	if _, err := io.Copy(f, resp.Body); err != nil {
		_ = f.Close()
		return err
	}
	return f.Close()
}

// ProbeBytes is how much Probe hashes.
const ProbeBytes = 64 << 20

// Probe times a fixed piece of work on the given cores (a taskset list,
// "1"): the sha256 of ProbeBytes zeros by sha256sum under taskset. It
// returns the wall time and the CPU time the work took. On a shared or
// virtual machine the same work takes more CPU time when the core runs
// slower (a busy SMT sibling, a host under load): on this one it took
// 203–321 ms within minutes (docs/chaos.md, 2026-11-30), and load tests'
// figures moved with it.
func Probe(ctx context.Context, cpus string) (wall, cpu time.Duration, err error) {
	cmd := exec.CommandContext(ctx, "taskset", "-c", cpus, "sha256sum")
	cmd.Stdin = io.LimitReader(zeros{}, ProbeBytes)
	start := time.Now()
	if out, err := cmd.CombinedOutput(); err != nil {
		return 0, 0, fmt.Errorf("speed probe (taskset -c %s sha256sum): %w: %s", cpus, err, out)
	}
	return time.Since(start), cmd.ProcessState.UserTime() + cmd.ProcessState.SystemTime(), nil
}

// zeros reads as an endless run of zero bytes.
type zeros struct{}

func (zeros) Read(p []byte) (int, error) {
	clear(p)
	return len(p), nil
}
