package chaos

import (
	"context"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// overloadRules: people with a limit they never reach, and one abusive bot
// whose rule fails open — the rule that turned overload into an outage of
// enforcement on main (admitted 4.2–8.7× its limit at 2× saturation).
const overloadRules = `version: 1
rules:
  - {id: people, tier: principal, kinds: [user], limit: 1000000, period: 1s, fail: open}
  - {id: abuser, tier: principal, kinds: [bot], limit: 50, period: 1s, fail: open}
`

// overloadDeadline is every caller's deadline in the open-loop phases: what a
// gateway gives a rate-limit call before it fails open by itself.
const overloadDeadline = 50 * time.Millisecond

// Overload measures the limiter's saturation pinned to a core of its own
// (closed loop, 64 callers), then offers 1.3× and 2× that rate open loop over
// 1,024 connections, every caller giving up after 50 ms (sent as
// X-Floodgate-Timeout-Ms), a tenth of it from one abusive bot limited to
// 50/s under a fail-open rule and a tenth marked critical. The limiter runs
// alone on core 1 (`taskset -c 1`, GOMAXPROCS 1); this process (the load
// generator), Redis and the broker on core 0.
//
// Invariants (held strictly): failed open ≤ 1 %, the abuser ≤ 1.2× its
// limit, RSS ≤ 400 MiB, and no call dropped for its deadline while its
// caller still waited (the limiter's deadline starts when it reads the
// request, after the caller's). Targets, reported with their figures (a
// loaded shared machine moves them): answers within the deadline ≥ 90 % of
// saturation, critical p99 ≤ 25 ms.
func Overload(ctx context.Context, e *Env, s Size, r *Result) error {
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	rules := filepath.Join(e.TempDir("overload"), "rules.yaml")
	if err := os.WriteFile(rules, []byte(overloadRules), 0o644); err != nil {
		return err
	}
	lim, err := e.StartLimiter(ctx, b, rd, "", "FLOODGATE_LIMITER_RULES="+rules, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT=", "GOMAXPROCS=1")
	if err != nil {
		return err
	}
	pinned := runtime.NumCPU() >= 2
	if pinned {
		if err := pin(lim.Pid(), "1"); err != nil {
			return err
		}
		for _, pid := range []int{rd.proc.Pid(), b.proc.Pid(), os.Getpid()} {
			if err := pin(pid, "0"); err != nil {
				return err
			}
		}
		defer func() { _ = pin(os.Getpid(), "0-"+strconv.Itoa(runtime.NumCPU()-1)) }()
		r.metric("pinning", "limiter on core 1 (GOMAXPROCS 1), load generator, Redis and broker on core 0; load average %s", loadAverage())
	} else {
		r.metric("pinning", "none: one core; load average %s", loadAverage())
	}
	people := users("ov", 1000)
	phase := max(s.Outage/2, 5*time.Second)

	// CPU per answered check, of the limiter and of this process (the load
	// generator), and each core's busy share: a phase whose generator core
	// was over 90 % busy measured the generator, not the limiter.
	type cpuAt struct {
		at, lim, gen time.Duration
		cores        []time.Duration
	}
	start := time.Now()
	cpuNow := func() cpuAt {
		return cpuAt{time.Since(start), cputime.Of(lim.Pid()), cputime.Self(), coreBusy()}
	}
	cpuPerCheck := func(from, to cpuAt, answered int) (string, bool) {
		n := float64(max(answered, 1))
		wall := (to.at - from.at).Seconds()
		var busy []string
		genSaturated := false
		for i := range min(len(from.cores), len(to.cores)) {
			share := (to.cores[i] - from.cores[i]).Seconds() / wall
			busy = append(busy, fmt.Sprintf("core %d %.0f %%", i, 100*share))
			if i == 0 && share > 0.9 {
				genSaturated = true
			}
		}
		return fmt.Sprintf("CPU per answered check: limiter %.0f µs, load generator %.0f µs; %s busy",
			float64((to.lim-from.lim).Microseconds())/n, float64((to.gen-from.gen).Microseconds())/n, strings.Join(busy, ", ")), genSaturated
	}
	satLoad := &Load{URL: "http://" + lim.Addr, Rate: 1 << 30, Workers: 64, Next: func(w, i int) events.Principal { return people[(w*7919+i)%len(people)] }}
	sat0 := cpuNow()
	stop := startLoad(ctx, satLoad)
	_ = sleep(ctx, phase)
	stop()
	sat1 := cpuNow()
	sat := Summarise(satLoad.Results(), time.Time{}, time.Time{})
	satRate := float64(sat.Answered) / phase.Seconds()
	satCPU, satGen := cpuPerCheck(sat0, sat1, sat.Answered)
	r.metric("saturation", "%.0f checks/s (64 callers, closed loop), p99 %s; %s%s", satRate, ms(sat.P99), satCPU, invalidNote(satGen))

	for _, f := range []float64{1.3, 2} {
		abuser := events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("abuser-%.1f-%d", f, time.Now().UnixNano())}
		rate := int(f * satRate)
		load := &Load{URL: "http://" + lim.Addr, Rate: rate, Workers: 1024, Deadline: overloadDeadline, Next: func(w, i int) events.Principal {
			if (w+i)%10 == 0 {
				return abuser
			}
			return people[(w*7919+i)%len(people)]
		}, Priority: func(w, i int) string {
			if (w+i)%10 == 5 {
				return "critical"
			}
			return ""
		}}
		var peakG float64
		var mu sync.Mutex
		sctx, cancel := context.WithCancel(ctx)
		go func() {
			for sctx.Err() == nil {
				if g, err := lim.Metric(sctx, "go_goroutines"); err == nil {
					mu.Lock()
					peakG = max(peakG, g)
					mu.Unlock()
				}
				_ = sleep(sctx, 500*time.Millisecond)
			}
		}()
		dropped0, _ := lim.Metric(ctx, "floodgate_limiter_calls_dropped_past_deadline_total") // absent until the first drop
		cpu0 := cpuNow()
		stop := startLoad(ctx, load)
		_ = sleep(ctx, phase)
		stop()
		cancel()
		cpu1 := cpuNow()
		dropped1, _ := lim.Metric(ctx, "floodgate_limiter_calls_dropped_past_deadline_total")
		elapsed := cpu1.at - cpu0.at
		checks := load.Results()
		w := Summarise(checks, time.Time{}, time.Time{})
		var failedOpen, shed, abuserAllowed, inTime, droppedWaiting int
		var crit []time.Duration
		for _, c := range checks {
			if c.OK && c.Degraded && !c.Shed {
				failedOpen++
			}
			if c.OK && c.Shed {
				shed++
			}
			if c.OK && c.Allowed && c.Principal == abuser {
				abuserAllowed++
			}
			if c.OK && c.Latency <= overloadDeadline {
				inTime++
			}
			if c.OK && c.Dropped {
				droppedWaiting++
			}
			if c.Priority == "critical" {
				lat := c.Latency
				if !c.OK {
					lat = max(lat, overloadDeadline) // no answer: as late as the caller waited
				}
				crit = append(crit, lat)
			}
		}
		slices.Sort(crit)
		var critP99 time.Duration
		if len(crit) > 0 {
			critP99 = crit[min(len(crit)-1, len(crit)*99/100)]
		}
		allowedMax := 50 + 50*elapsed.Seconds() // burst + refill
		rss, err := peakRSS(lim.Pid())
		if err != nil {
			return err
		}
		mu.Lock()
		g := peakG
		mu.Unlock()
		name := fmt.Sprintf("%.1f×", f)
		goodput := float64(inTime) / elapsed.Seconds()
		cpu, genSat := cpuPerCheck(cpu0, cpu1, w.Answered)
		r.metric(name, "offered %d/s over 1024 connections, deadline %s; %d checks, %d answered within it (%.0f/s = %.0f %% of saturation), p50 %s, p99 %s; critical p99 %s; %.2f %% shed, %.2f %% failed open; %.0f dropped past their deadline by the limiter; abuser admitted %.2f× its limit; peak RSS %d MiB, peak goroutines %.0f; %s; load average %s%s",
			rate, overloadDeadline, w.Sent, inTime, goodput, 100*goodput/max(satRate, 1), ms(w.P50), ms(w.P99), ms(critP99),
			pct(shed, w.Answered), pct(failedOpen, w.Answered), dropped1-dropped0, float64(abuserAllowed)/allowedMax, rss>>20, g, cpu, loadAverage(), invalidNote(genSat))
		r.metric(name+" targets", "answers within the deadline ≥ 90 %% of saturation: %s (%.0f %%); critical p99 ≤ 25 ms: %s (%s)",
			metOrNot(goodput >= 0.9*satRate), 100*goodput/max(satRate, 1), metOrNot(critP99 <= 25*time.Millisecond), ms(critP99))
		r.require(name+": failed open ≤ 1 %", w.Answered > 0 && failedOpen*100 <= w.Answered, "%.2f %%", pct(failedOpen, w.Answered))
		r.require(name+": abuser ≤ 1.2× its limit", float64(abuserAllowed) <= 1.2*allowedMax, "%d allowed, limit %.0f", abuserAllowed, allowedMax)
		r.require(name+": RSS ≤ 400 MiB", rss <= 400<<20, "%d MiB", rss>>20)
		r.require(name+": no call dropped for its deadline while its caller waited", droppedWaiting == 0, "%d", droppedWaiting)
	}
	return nil
}

// pin sets the CPU affinity of every thread of pid (taskset -a -p -c cpus).
func pin(pid int, cpus string) error {
	if out, err := exec.Command("taskset", "-a", "-p", "-c", cpus, strconv.Itoa(pid)).CombinedOutput(); err != nil {
		return fmt.Errorf("taskset -c %s %d: %w: %s", cpus, pid, err, out)
	}
	return nil
}

// coreBusy is each core's busy time so far (/proc/stat: all but idle and
// iowait); nil when it cannot be read.
func coreBusy() []time.Duration {
	b, err := os.ReadFile("/proc/stat")
	if err != nil {
		return nil
	}
	var out []time.Duration
	for _, line := range strings.Split(string(b), "\n") {
		f := strings.Fields(line)
		if len(f) < 6 || !strings.HasPrefix(f[0], "cpu") || f[0] == "cpu" {
			continue
		}
		var busy int64
		for i, v := range f[1:] {
			n, _ := strconv.ParseInt(v, 10, 64)
			if i != 3 && i != 4 { // idle, iowait
				busy += n
			}
		}
		out = append(out, time.Duration(busy)*time.Second/100) // USER_HZ
	}
	return out
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

func invalidNote(genSaturated bool) string {
	if genSaturated {
		return " — INVALID: the generator's core was over 90 % busy"
	}
	return ""
}

func metOrNot(ok bool) string {
	if ok {
		return "met"
	}
	return "missed"
}

func pct(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return 100 * float64(n) / float64(of)
}

// peakRSS is the process's peak resident set (VmHWM).
func peakRSS(pid int) (int64, error) {
	b, err := os.ReadFile("/proc/" + strconv.Itoa(pid) + "/status")
	if err != nil {
		return 0, fmt.Errorf("read status: %w", err)
	}
	for _, line := range strings.Split(string(b), "\n") {
		if rest, ok := strings.CutPrefix(line, "VmHWM:"); ok {
			kb, err := strconv.ParseInt(strings.TrimSuffix(strings.TrimSpace(rest), " kB"), 10, 64)
			return kb << 10, err
		}
	}
	return 0, fmt.Errorf("no VmHWM in /proc/%d/status", pid)
}
