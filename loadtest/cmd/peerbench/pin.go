package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"
	"golang.org/x/sys/unix"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cgroup"
)

// placement is where a run's processes may run: the service under test on
// its cores alone, everything else (this generator, Redis, the broker, the
// services not under test) on the rest. Off, nothing is pinned.
type placement struct {
	on            bool
	service, rest []int
	// favoured: the run's processes are in a cgroup of the highest CPU
	// weight (favour), so the machine's other work on the rest's cores
	// runs in what they leave.
	favoured bool
	group    *cgroup.Group // the favoured cgroup, nil when not favoured
}

// quotaPeriod is the CPU bandwidth period of a service under -quota: short,
// as the chaos overload scenario's, so that a throttled service's stall is
// a few ms and not a 100 ms default period's.
const quotaPeriod = 4 * time.Millisecond

// limit puts the service pid under a CPU quota of cores (a cgroup of its
// own, of the favoured weight) for a round. undo reports how many periods
// throttled it and moves it back to the favoured cgroup, or to the root
// one when the run is not favoured.
func (p placement) limit(pid int, cores float64) (undo func() (throttled int64, err error), err error) {
	q, err := cgroup.Limit(fmt.Sprintf("floodgate-peerbench-quota-%d", pid), pid, cores, quotaPeriod)
	if err != nil {
		return nil, fmt.Errorf("-quota: %w", err)
	}
	return func() (int64, error) {
		throttled, _ := q.Throttled()
		if p.group != nil {
			if err := p.group.Add(pid); err != nil {
				return throttled, err
			}
		}
		return throttled, q.Remove()
	}, nil
}

// parseCPUs reads a taskset-style list: "1", "0,2", "2-3".
func parseCPUs(s string) ([]int, error) {
	var out []int
	for _, part := range strings.Split(s, ",") {
		lo, hi, isRange := strings.Cut(strings.TrimSpace(part), "-")
		a, err := strconv.Atoi(lo)
		if err != nil {
			return nil, fmt.Errorf("cpu list %q: %w", s, err)
		}
		b := a
		if isRange {
			if b, err = strconv.Atoi(hi); err != nil || b < a {
				return nil, fmt.Errorf("cpu list %q: bad range %q", s, part)
			}
		}
		for c := a; c <= b; c++ {
			if c >= runtime.NumCPU() {
				return nil, fmt.Errorf("cpu list %q: cpu %d, this machine has %d", s, c, runtime.NumCPU())
			}
			out = append(out, c)
		}
	}
	return out, nil
}

func newPlacement(on bool, service, rest string) (placement, error) {
	if !on {
		return placement{}, nil
	}
	s, err := parseCPUs(service)
	if err != nil {
		return placement{}, fmt.Errorf("-service-cpus: %w", err)
	}
	r, err := parseCPUs(rest)
	if err != nil {
		return placement{}, fmt.Errorf("-rest-cpus: %w", err)
	}
	for _, c := range s {
		for _, d := range r {
			if c == d {
				return placement{}, fmt.Errorf("-service-cpus %s and -rest-cpus %s share cpu %d", service, rest, c)
			}
		}
	}
	return placement{on: true, service: s, rest: r}, nil
}

// pin sets the CPU affinity of every thread of pid (taskset -a -cp): threads
// it creates later inherit it. 0 and an unpinned placement do nothing.
func (p placement) pin(pid int, cpus []int) error {
	if !p.on || pid == 0 {
		return nil
	}
	var set unix.CPUSet
	for _, c := range cpus {
		set.Set(c)
	}
	// Twice: a thread started while the first pass ran inherits the old set.
	for range 2 {
		tasks, err := os.ReadDir(fmt.Sprintf("/proc/%d/task", pid))
		if err != nil {
			return fmt.Errorf("pin %d: %w", pid, err)
		}
		for _, t := range tasks {
			tid, err := strconv.Atoi(t.Name())
			if err != nil {
				continue
			}
			if err := unix.SchedSetaffinity(tid, &set); err != nil && err != unix.ESRCH {
				return fmt.Errorf("pin %d thread %d to %v: %w", pid, tid, cpus, err)
			}
		}
	}
	return nil
}

// command runs bin on cpus from its first instruction (taskset -c), so a Go
// program sizes GOMAXPROCS to them.
func (p placement) command(cpus []int, bin string, args ...string) *exec.Cmd {
	if !p.on {
		return exec.Command(bin, args...)
	}
	return exec.Command("taskset", append([]string{"-c", cpuList(cpus), bin}, args...)...)
}

func cpuList(cpus []int) string {
	s := make([]string, len(cpus))
	for i, c := range cpus {
		s[i] = strconv.Itoa(c)
	}
	return strings.Join(s, ",")
}

// cores says where the processes run, for the printed report.
func (p placement) String() string {
	if !p.on {
		return "not pinned: every process on every core"
	}
	return fmt.Sprintf("pinned: the service under test on cpu %s alone; generator, Redis, broker and idle services on cpu %s", cpuList(p.service), cpuList(p.rest))
}

// private is a Redis and a broker of this run's own, started on the rest's
// cores, so that nothing of the shared stack runs on the service's core.
type private struct {
	redisAddr, brokerAddr string
	redisPid, brokerPid   int
	stops                 []func()
}

func (pv *private) stop() {
	for i := len(pv.stops) - 1; i >= 0; i-- {
		pv.stops[i]()
	}
}

// startPrivate starts redis-server (no persistence) and the local stack's
// broker (in memory) on free loopback ports, on the rest's cores, and
// creates the topics the limiter publishes to.
func startPrivate(ctx context.Context, p placement, root string, withRedis, withBroker bool, topics []string) (*private, error) {
	pv := &private{}
	ok := false
	defer func() {
		if !ok {
			pv.stop()
		}
	}()
	if withRedis {
		if err := pv.startRedis(p); err != nil {
			return nil, err
		}
	}
	if withBroker {
		if err := pv.startBroker(ctx, p, root, topics); err != nil {
			return nil, err
		}
	}
	ok = true
	return pv, nil
}

func (pv *private) startRedis(p placement) error {
	rport := freePort()
	redisBin, err := exec.LookPath("redis-server")
	if err != nil {
		return fmt.Errorf("a private Redis needs redis-server on PATH (or -redis HOST:PORT): %w", err)
	}
	rc := p.command(p.rest, redisBin, "--port", strconv.Itoa(rport), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no", "--logfile", "")
	if err := start(rc, &pv.stops); err != nil {
		return err
	}
	pv.redisAddr, pv.redisPid = fmt.Sprintf("127.0.0.1:%d", rport), rc.Process.Pid
	return waitListen(pv.redisAddr)
}

func (pv *private) startBroker(ctx context.Context, p placement, root string, topics []string) error {
	bport := freePort()
	brokerBin := filepath.Join(root, ".local", "bin", "floodgate-broker")
	bc := p.command(p.rest, brokerBin, "-port", strconv.Itoa(bport), "-brokers", "1", "-log-level", "warn")
	if err := start(bc, &pv.stops); err != nil {
		return fmt.Errorf("a private broker needs %s (make up builds it; or -broker HOST:PORT): %w", brokerBin, err)
	}
	pv.brokerAddr, pv.brokerPid = fmt.Sprintf("127.0.0.1:%d", bport), bc.Process.Pid
	if err := waitListen(pv.brokerAddr); err != nil {
		return err
	}
	c := &kafka.Client{Addr: kafka.TCP(pv.brokerAddr), Timeout: 10 * time.Second}
	var cfgs []kafka.TopicConfig
	for _, t := range topics {
		cfgs = append(cfgs, kafka.TopicConfig{Topic: t, NumPartitions: 4, ReplicationFactor: 1})
	}
	resp, err := c.CreateTopics(ctx, &kafka.CreateTopicsRequest{Topics: cfgs})
	if err != nil {
		return fmt.Errorf("private broker: create topics: %w", err)
	}
	for t, e := range resp.Errors {
		if e != nil {
			return fmt.Errorf("private broker: create topic %s: %w", t, e)
		}
	}
	return nil
}

func start(cmd *exec.Cmd, stops *[]func()) error {
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Start(); err != nil {
		return fmt.Errorf("start %s: %w", cmd.Path, err)
	}
	*stops = append(*stops, func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
	return nil
}

func waitListen(addr string) error {
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", addr, 200*time.Millisecond); err == nil {
			_ = c.Close()
			return nil
		}
	}
	return fmt.Errorf("nothing listens on %s after 30 s", addr)
}

func freePort() int {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().(*net.TCPAddr).Port
}

// onlyUnderTest puts pid on the service cores and every other service of
// all on the rest's, before a round.
func (p placement) onlyUnderTest(pid int, all []int) error {
	for _, o := range all {
		if o != 0 && o != pid {
			if err := p.pin(o, p.rest); err != nil {
				return err
			}
		}
	}
	return p.pin(pid, p.service)
}
