package chaos

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"runtime"
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

// Overload measures the limiter's saturation (closed loop, 64 callers), then
// offers 1.3× and 2× that rate open loop (many paced callers, each waiting
// at most 2 s), a tenth of it from one abusive bot limited to 50/s under a
// fail-open rule. The limiter must shed from local state, never fail open.
func Overload(ctx context.Context, e *Env, s Size, r *Result) error {
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	rules := filepath.Join(e.TempDir("overload"), "rules.yaml")
	if err := os.WriteFile(rules, []byte(overloadRules), 0o644); err != nil {
		return err
	}
	lim, err := e.StartLimiter(ctx, b, rd, "", "FLOODGATE_LIMITER_RULES="+rules, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT=")
	if err != nil {
		return err
	}
	people := users("ov", 1000)
	phase := max(s.Outage/2, 5*time.Second)

	// CPU per answered check, of the limiter and of this process (the load
	// generator): a shed answer still costs the HTTP exchange and its
	// decision event, and that share of a served answer's cost bounds what
	// shedding can absorb on cores the generator shares.
	// The machine's busy cores say whether the run was CPU-bound: then the
	// answered p99 is the generator's requests in flight over the checks
	// answered a second (Little's law), whatever the limiter decides.
	type cpuAt struct{ at, lim, gen, machine time.Duration }
	start := time.Now()
	cpuNow := func() cpuAt {
		return cpuAt{time.Since(start), cputime.Of(lim.Pid()), cputime.Self(), cputime.Machine()}
	}
	cpuPerCheck := func(from, to cpuAt, answered int) string {
		n := float64(max(answered, 1))
		return fmt.Sprintf("CPU per answered check: limiter %.0f µs, load generator %.0f µs; machine %.2f of %d cores busy",
			float64((to.lim-from.lim).Microseconds())/n, float64((to.gen-from.gen).Microseconds())/n,
			(to.machine-from.machine).Seconds()/(to.at-from.at).Seconds(), runtime.NumCPU())
	}
	satLoad := &Load{URL: "http://" + lim.Addr, Rate: 1 << 30, Workers: 64, Next: func(w, i int) events.Principal { return people[(w*7919+i)%len(people)] }}
	sat0 := cpuNow()
	stop := startLoad(ctx, satLoad)
	_ = sleep(ctx, phase)
	stop()
	sat1 := cpuNow()
	sat := Summarise(satLoad.Results(), time.Time{}, time.Time{})
	satRate := float64(sat.Answered) / phase.Seconds()
	r.metric("saturation", "%.0f checks/s (64 callers, closed loop), p99 %s; %s", satRate, ms(sat.P99), cpuPerCheck(sat0, sat1, sat.Answered))

	for _, f := range []float64{1.3, 2} {
		abuser := events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("abuser-%.1f-%d", f, time.Now().UnixNano())}
		rate := int(f * satRate)
		load := &Load{URL: "http://" + lim.Addr, Rate: rate, Workers: 1024, Next: func(w, i int) events.Principal {
			if (w+i)%10 == 0 {
				return abuser
			}
			return people[(w*7919+i)%len(people)]
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
		cpu0 := cpuNow()
		stop := startLoad(ctx, load)
		_ = sleep(ctx, phase)
		stop()
		cancel()
		cpu1 := cpuNow()
		elapsed := cpu1.at - cpu0.at
		checks := load.Results()
		w := Summarise(checks, time.Time{}, time.Time{})
		var failedOpen, shed, abuserAllowed int
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
		r.metric(name, "offered %d/s; %d checks, %s answered (%.0f/s), p50 %s, p99 %s; %.2f %% shed, %.2f %% failed open; abuser admitted %.2f× its limit; peak RSS %d MiB, peak goroutines %.0f; %s",
			rate, w.Sent, w.Availability(), float64(w.Answered)/elapsed.Seconds(), ms(w.P50), ms(w.P99),
			pct(shed, w.Answered), pct(failedOpen, w.Answered), float64(abuserAllowed)/allowedMax, rss>>20, g, cpuPerCheck(cpu0, cpu1, w.Answered))
		r.require(name+": failed open ≤ 1 %", w.Answered > 0 && failedOpen*100 <= w.Answered, "%.2f %%", pct(failedOpen, w.Answered))
		r.require(name+": abuser ≤ 1.2× its limit", float64(abuserAllowed) <= 1.2*allowedMax, "%d allowed, limit %.0f", abuserAllowed, allowedMax)
		r.require(name+": RSS ≤ 400 MiB", rss <= 400<<20, "%d MiB", rss>>20)
		r.require(name+": answered p99 ≤ 10 ms", w.P99 <= 10*time.Millisecond, "%s", ms(w.P99))
	}
	return nil
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
