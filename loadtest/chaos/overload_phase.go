package chaos

// The overload scenarios' measurement of one open-loop phase: the limiters
// under test, their CPU and metrics around the phase, and what the callers
// got (overloadRun.phase).

import (
	"context"
	"fmt"
	"maps"
	"math"
	"os"
	"path/filepath"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
	"github.com/floodgate-dev/floodgate/loadtest/internal/promtext"
	"github.com/floodgate-dev/floodgate/loadtest/internal/schedwait"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// overloadRun is one overload scenario's set-up, as its phases measure it.
type overloadRun struct {
	r       *Result
	viaGRPC bool
	// lim is the limiter under test; crit, when not nil, the critical
	// cluster's own (Size.CriticalLimiter). limiters holds both.
	lim, crit                *Service
	limiters                 []*Service
	grpcAddr, critAddr       string
	debugAddr, critDebugAddr string
	// harness is Redis's and the broker's pids: with this process, the
	// load generator's core.
	harness []int
	// quota is the limiter's CPU quota (nil: none); critQuota the critical
	// limiter's own (Size.CriticalQuota).
	quota, critQuota *CPUQuota
	people           []events.Principal
	conns            int           // the open-loop phases' gRPC connections
	length           time.Duration // of each phase and capacity step
	profiles         string        // the directory the phases' profiles go to
	trace            time.Duration // of the limiter, in each phase (Size.Trace); 0: none
	perfHz           int           // perf's samples a second in the interleaved phases (Size.Perf); 0: none
	start            time.Time
	// satRate is what the phases are judged against, closedRate the closed
	// loop's saturation.
	satRate, closedRate float64
}

// limCPU is the CPU time the limiters have used.
func (o *overloadRun) limCPU() time.Duration {
	var t time.Duration
	for _, l := range o.limiters {
		t += cputime.Of(l.Pid())
	}
	return t
}

// limMetric sums one metric over the limiters (absent: 0).
func (o *overloadRun) limMetric(ctx context.Context, name string) float64 {
	var sum float64
	for _, l := range o.limiters {
		v, _ := l.Metric(ctx, name)
		sum += v
	}
	return sum
}

// via sets l's transport: POST /v1/check over HTTP/1.1, or gRPC over conns
// connections.
func (o *overloadRun) via(l *Load, conns int) *Load {
	if o.viaGRPC {
		l.GRPCAddr, l.Conns = o.grpcAddr, conns
	}
	return l
}

// open readies l's connections and collects the garbage before a phase
// (openForPhase).
func (o *overloadRun) open(ctx context.Context, l *Load) error {
	addrs := []string{o.debugAddr}
	if o.crit != nil {
		addrs = append(addrs, o.critDebugAddr)
	}
	return openForPhase(ctx, l, addrs...)
}

// openLoad is the open-loop phases' traffic at rate: 1,024 callers, each
// giving up after the deadline, a tenth of the checks from abuser and a
// tenth marked critical.
func (o *overloadRun) openLoad(rate int, abuser events.Principal) *Load {
	return o.via(&Load{CriticalCluster: o.viaGRPC, CriticalAddr: o.critAddr, URL: "http://" + o.lim.Addr, Rate: rate, Workers: 1024, Deadline: overloadDeadline, Next: func(w, i int) events.Principal {
		if (w+i)%10 == 0 {
			return abuser
		}
		return o.people[(w*7919+i)%len(o.people)]
	}, Priority: func(w, i int) string {
		if (w+i)%10 == 5 {
			return "critical"
		}
		return ""
	}}, o.conns)
}

// CPU per answered check, of the limiter and of this process (the load
// generator), and each core's busy share: a phase in which the generator,
// Redis and the broker needed over 90 % of their core measured the
// generator, not the limiter (the rest of the machine's work on that core
// runs in what they leave: FavourCPU).
type cpuAt struct {
	at, lim, gen, harness time.Duration
	busy, total           []int64 // per core (cputime.CoreTimes)
}

func (o *overloadRun) cpuNow() cpuAt {
	gen := cputime.Self()
	harness := gen
	for _, pid := range o.harness {
		harness += cputime.Of(pid)
	}
	busy, total := cputime.CoreTimes()
	return cpuAt{time.Since(o.start), o.limCPU(), gen, harness, busy, total}
}

// cpuPerCheck describes the CPU used between from and to for answered
// checks, and says whether the generator's core was over 90 % busy.
func cpuPerCheck(from, to cpuAt, answered int) (string, bool) {
	n := float64(max(answered, 1))
	wall := (to.at - from.at).Seconds()
	var busy []string
	for i, share := range cputime.CoreBusy(from.busy, from.total, to.busy, to.total) {
		busy = append(busy, fmt.Sprintf("core %d %.0f %%", i, 100*share))
	}
	harness := (to.harness - from.harness).Seconds() / wall
	return fmt.Sprintf("CPU per answered check: limiter %.0f µs, load generator %.0f µs; limiter %.0f %% of a core, load generator %.0f %% (with Redis and the broker %.0f %%); %s busy",
		float64((to.lim-from.lim).Microseconds())/n, float64((to.gen-from.gen).Microseconds())/n,
		100*(to.lim-from.lim).Seconds()/wall, 100*(to.gen-from.gen).Seconds()/wall, 100*harness, strings.Join(busy, ", ")), harness > 0.9
}

// perCoreSecond is n answers over the limiter's CPU time between from and to.
func perCoreSecond(from, to cpuAt, n int) float64 {
	return float64(n) / max((to.lim-from.lim).Seconds(), 0.01)
}

// throttled is the limiter's quota's throttled periods and time so far.
func (o *overloadRun) throttled() (int64, time.Duration) {
	if o.quota == nil {
		return 0, 0
	}
	return o.quota.Throttled()
}

// readTurns is the entry gate's paced-read turns by how they came.
func (o *overloadRun) readTurns(ctx context.Context) map[string]float64 {
	return seriesByLabel(ctx, o.lim, "floodgate_limiter_grpc_read_turns_total", "how", "at_once", "given", "max_wait")
}

// gateLeft is the calls that left the entry gate, by outcome.
func (o *overloadRun) gateLeft(ctx context.Context) map[string]float64 {
	return seriesByLabel(ctx, o.lim, "floodgate_limiter_grpc_gate_left_total", "outcome", "refused", "dropped", "past_deadline", "canceled")
}

// phaseOutcome is what a phase's targets are judged on.
type phaseOutcome struct {
	goodput float64 // answers within the deadline per second
	// critP99 is the critical calls' p99, at the caller's socket where the
	// receive time is known; judgedAt says where, and the p99 as read.
	critP99  time.Duration
	judgedAt string
}

// startTrace takes a runtime trace of the limiter for o.trace from the
// middle of the phase, into prefix-limiter.trace (o.trace 0: none); the
// returned func waits for it and says what its goroutines waited for the
// CPU (schedwait), or why not.
func (o *overloadRun) startTrace(ctx context.Context, prefix string) func() string {
	if o.trace <= 0 {
		return func() string { return "" }
	}
	path := prefix + "-limiter.trace"
	done := make(chan error, 1)
	go func() {
		if err := sleep(ctx, max(0, o.length-o.trace)/2); err != nil {
			done <- err
			return
		}
		done <- cputime.Profile(ctx, fmt.Sprintf("http://%s/debug/pprof/trace?seconds=%g", o.debugAddr, o.trace.Seconds()), path)
	}()
	return func() string {
		if err := <-done; err != nil {
			return fmt.Sprintf("; trace: %v", err)
		}
		f, err := os.Open(path)
		if err != nil {
			return fmt.Sprintf("; trace: %v", err)
		}
		defer f.Close()
		r, err := schedwait.Read(f)
		if err != nil {
			return fmt.Sprintf("; trace %s: %v", path, err)
		}
		return fmt.Sprintf("; trace %s (go run ./loadtest/cmd/schedwait %s): the limiter's goroutines waited to run once runnable, by what had woken them, %s", path, path, r.Line())
	}
}

// phase offers rate open loop for o.length, a tenth of it from abuser,
// reports the phase as name (its figures, the limiters' CPU, run queue,
// gate and critical calls) and checks its invariants; profiles go to files
// named after f.
func (o *overloadRun) phase(ctx context.Context, name string, f float64, rate int, abuser events.Principal) (phaseOutcome, error) {
	r, lim, crit := o.r, o.lim, o.crit
	probe := coreProbe(ctx)
	load := o.openLoad(rate, abuser)
	if err := o.open(ctx, load); err != nil {
		return phaseOutcome{}, err
	}
	var peakG, peakRunnable, peakWaiting float64
	gateLimits := map[float64]bool{}
	targetLo, targetHi := math.Inf(1), 0.0
	var mu sync.Mutex
	sctx, cancel := context.WithCancel(ctx)
	go func() {
		for sctx.Err() == nil {
			// One scrape a sample: each costs the limiter CPU it is
			// short of.
			e, err := lim.Metrics(sctx)
			if err == nil {
				g, _ := e.Sum("go_goroutines")
				runnable, _ := e.Sum("go_sched_goroutines_runnable_goroutines")
				mu.Lock()
				peakG, peakRunnable = max(peakG, g), max(peakRunnable, runnable)
				if o.viaGRPC {
					w, _ := e.Sum("floodgate_limiter_grpc_gate_waiting")
					peakWaiting = max(peakWaiting, w)
					if l, ok := e.Sum("floodgate_limiter_grpc_gate_limit"); ok {
						gateLimits[l] = true
					}
					if tg, ok := e.Sum("floodgate_limiter_grpc_gate_target_seconds"); ok {
						targetLo, targetHi = min(targetLo, tg), max(targetHi, tg)
					}
				}
				mu.Unlock()
			}
			_ = sleep(sctx, 500*time.Millisecond)
		}
	}()
	dropped0 := o.limMetric(ctx, "floodgate_limiter_calls_dropped_past_deadline_total") // absent until the first drop
	gcCPU0, gcCycles0 := o.limMetric(ctx, "go_cpu_classes_gc_total_cpu_seconds_total"), o.limMetric(ctx, "go_gc_duration_seconds_count")
	canceled0 := canceledCalls(ctx, o.limiters)
	turns0, gone0 := o.readTurns(ctx), o.gateLeft(ctx)
	thr0, thrWait0 := o.throttled()
	var critThr0 int64
	var critThrWait0 time.Duration
	if o.critQuota != nil {
		critThr0, critThrWait0 = o.critQuota.Throttled()
	}
	sched0, gen0, check0 := schedLatencies(ctx, lim), ownSchedLatencies(), checkSeconds(ctx, lim)
	var critSched0, critCheck0 []promtext.Bucket
	var critCPU0 time.Duration
	if crit != nil {
		critSched0, critCheck0, critCPU0 = schedLatencies(ctx, crit), checkSeconds(ctx, crit), cputime.Of(crit.Pid())
	}
	cpu0 := o.cpuNow()
	began := time.Now()
	stop := startLoad(ctx, load)
	prefix := filepath.Join(o.profiles, fmt.Sprintf("%.1fx", f))
	prof := startProfiles(ctx, o.debugAddr, prefix, o.length-2*time.Second)
	critProf := make(chan error, 1)
	if crit != nil {
		go func() {
			critProf <- cputime.Profile(ctx, fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", o.critDebugAddr, int((o.length-2*time.Second).Seconds())), prefix+"-critical-limiter.pprof")
		}()
	} else {
		critProf <- nil
	}
	traced := o.startTrace(ctx, prefix)
	_ = sleep(ctx, o.length)
	stop()
	cancel()
	cpu1 := o.cpuNow()
	thr1, thrWait1 := o.throttled()
	critThrottled := ""
	if o.critQuota != nil {
		n, wait := o.critQuota.Throttled()
		critThrottled = fmt.Sprintf("; its own quota throttled in %d periods (%s waiting)", n-critThr0, ms(wait-critThrWait0))
	}
	sched1, gen1, check1 := schedLatencies(ctx, lim), ownSchedLatencies(), checkSeconds(ctx, lim)
	var critSched1, critCheck1 []promtext.Bucket
	var critCPU1 time.Duration
	if crit != nil {
		critSched1, critCheck1, critCPU1 = schedLatencies(ctx, crit), checkSeconds(ctx, crit), cputime.Of(crit.Pid())
	}
	profNote := prof() + traced()
	if err := <-critProf; err != nil {
		profNote += fmt.Sprintf("; critical limiter's profile: %v", err)
	} else if crit != nil {
		profNote += ", " + prefix + "-critical-limiter.pprof"
	}
	dropped1 := o.limMetric(ctx, "floodgate_limiter_calls_dropped_past_deadline_total")
	gcCPU1, gcCycles1 := o.limMetric(ctx, "go_cpu_classes_gc_total_cpu_seconds_total"), o.limMetric(ctx, "go_gc_duration_seconds_count")
	canceled1 := canceledCalls(ctx, o.limiters)
	turns1, gone1 := o.readTurns(ctx), o.gateLeft(ctx)
	elapsed := cpu1.at - cpu0.at
	checks := load.Results()
	w := Summarise(checks, time.Time{}, time.Time{})
	t := tallyPhase(checks, load.AnsweredAfterGivingUp(), abuser, began)
	critQ := func(q int) time.Duration { return quantile(t.crit, q) }
	out := phaseOutcome{goodput: float64(t.inTime) / elapsed.Seconds(), critP99: critQ(99)}
	// The target is judged on the limiter's answer: at the caller's
	// socket where the receive time is known (gRPC), not after this
	// process's own run queue, which the generator's one shared core makes
	// wait as no gateway of its own would (docs/chaos.md).
	if t.arrivals {
		out.critP99 = quantile(t.critArrived, 99)
		out.judgedAt = fmt.Sprintf(" at the caller's socket; %s as this process read it", ms(critQ(99)))
	}
	allowedMax := abuserAllowedMax(elapsed)
	rss, err := o.peakRSS()
	if err != nil {
		return out, err
	}
	mu.Lock()
	g := peakG
	gateNote := "" // FLOODGATE_LIMITER_GRPC_GATE_MAX set
	if limits := slices.Sorted(maps.Keys(gateLimits)); len(limits) > 0 {
		left := func(outcome string) float64 { return gone1[outcome] - gone0[outcome] }
		gateNote = fmt.Sprintf("limit %.0f–%.0f, at most %.0f waiting, %.0f left to their callers (refused at the door %.0f, dropped from the queue %.0f, past their deadline %.0f, canceled %.0f)",
			limits[0], limits[len(limits)-1], peakWaiting, left("refused")+left("dropped")+left("past_deadline")+left("canceled"),
			left("refused"), left("dropped"), left("past_deadline"), left("canceled"))
		if targetHi > 0 {
			gateNote += fmt.Sprintf("; target %.1f–%.1f ms (FLOODGATE_LIMITER_GRPC_GATE_TARGET above twice the shortest Redis round trip of late)", 1000*targetLo, 1000*targetHi)
		}
		if turns1["given"] > 0 {
			gateNote += fmt.Sprintf("; reads paced (FLOODGATE_LIMITER_GRPC_GATE_PACE): turns at once %.0f, given %.0f, after the longest wait %.0f",
				turns1["at_once"]-turns0["at_once"], turns1["given"]-turns0["given"], turns1["max_wait"]-turns0["max_wait"])
		}
	}
	mu.Unlock()
	if err := load.Err(); err != nil {
		return out, err
	}
	conns := load.Workers
	if o.viaGRPC {
		conns = load.Conns
	}
	cpu, genSat := cpuPerCheck(cpu0, cpu1, w.Answered)
	r.metric(name, "offered %d/s from 1024 callers over %d connections, deadline %s; %d checks, %d answered within it (%.0f/s = %.0f %% of saturation, %.0f %% of the closed loop's; %.0f per limiter core-second), %d answered in all (%d of them read after the deadline), p50 %s, p99 %s; critical p99 %s; %.2f %% shed, %.2f %% failed open; %.0f dropped past their deadline by the limiter, %.0f reset by their callers before they were run (not answered); abuser admitted %.2f× its limit; peak RSS %d MiB, peak goroutines %.0f; %s; throttled in %d periods (%s waiting); load average %s; %s%s",
		rate, conns, overloadDeadline, w.Sent, t.inTime, out.goodput, 100*out.goodput/max(o.satRate, 1), 100*out.goodput/max(o.closedRate, 1), perCoreSecond(cpu0, cpu1, t.inTime), w.Answered, t.late, ms(w.P50), ms(w.P99), ms(critQ(99)),
		pct(t.shed, w.Answered), pct(t.failedOpen, t.inTime), dropped1-dropped0, canceled1-canceled0, float64(t.abuserAllowed)/allowedMax, rss>>20, g, cpu,
		thr1-thr0, ms(thrWait1-thrWait0), loadAverage(), profNote, invalidNote(genSat))
	r.metric(name+" core 1", "%s, just before the phase", probe)
	r.metric(name+" collector", "the limiter's garbage collector: %.0f cycles, %.0f ms of CPU (the runtime's estimate, go_cpu_classes_gc_total_cpu_seconds_total), %.0f %% of the limiter's",
		gcCycles1-gcCycles0, 1000*(gcCPU1-gcCPU0), 100*(gcCPU1-gcCPU0)/max((cpu1.lim-cpu0.lim).Seconds(), 0.001))
	r.metric(name+" run queue", "%s; runnable goroutines at most %.0f (sampled every 0.5 s); the load generator's own goroutines: %s",
		schedNote(sched0, sched1), peakRunnable, schedNote(gen0, gen1))
	if gateNote != "" {
		r.metric(name+" entry gate", "%s; %d answered UNAVAILABLE within the deadline (%.2f %% of the calls sent; not decided, the gateway fails open on them at once)",
			gateNote, t.overloaded, pct(t.overloaded, w.Sent))
	}
	arrivedNote := ""
	if t.arrivals {
		arrivedNote = fmt.Sprintf("; at the caller's socket (the kernel's receive time, before this process's run queue; a call not answered in time as above, but one given up on whose answer came anyway at that answer's receive time): p50 %s, p90 %s, p99 %s; of the %d this process gave up on at their deadline, %d had their answer at its socket within the deadline",
			ms(quantile(t.critArrived, 50)), ms(quantile(t.critArrived, 90)), ms(quantile(t.critArrived, 99)), t.critGaveUp, t.critGaveUpInTime)
	}
	r.metric(name+" critical", "%d sent, %.2f %% answered within the deadline (of the %d not, %d sent in the phase's first second); p50 %s, p90 %s, p99 %s (a call not answered counts as the deadline)%s; all calls: %s",
		len(t.crit), pct(t.critInTime, len(t.crit)), len(t.crit)-t.critInTime, t.critMissedFirst, ms(critQ(50)), ms(critQ(90)), ms(critQ(99)), arrivedNote, checkNote(check0, check1))
	if crit != nil {
		r.metric(name+" critical limiter", "%.0f %% of a core, %.0f µs of its CPU per critical call answered%s; %s; %s",
			100*(critCPU1-critCPU0).Seconds()/elapsed.Seconds(), float64((critCPU1-critCPU0).Microseconds())/float64(max(t.critInTime, 1)),
			critThrottled, schedNote(critSched0, critSched1), checkNote(critCheck0, critCheck1))
	}
	requireInvariants(r, name, t, allowedMax, rss)
	return out, nil
}

// abuserAllowedMax is what the overload rules admit of the abuser over
// elapsed: its burst and refill.
func abuserAllowedMax(elapsed time.Duration) float64 { return 50 + 50*elapsed.Seconds() }

// peakRSS is the largest peak RSS of the limiters so far.
func (o *overloadRun) peakRSS() (int64, error) {
	var rss int64
	for _, l := range o.limiters {
		n, err := peakRSS(l.Pid())
		if err != nil {
			return 0, err
		}
		rss = max(rss, n)
	}
	return rss, nil
}

// requireInvariants states the overload invariants of phase name: what its
// callers got (t), the abuser's admissions against allowedMax, and the
// limiters' peak RSS.
func requireInvariants(r *Result, name string, t phaseTally, allowedMax float64, rss int64) {
	r.require(name+": failed open ≤ 1 %", t.inTime > 0 && t.failedOpen*100 <= t.inTime, "%.2f %% of %d answers within the deadline", pct(t.failedOpen, t.inTime), t.inTime)
	r.require(name+": abuser ≤ 1.2× its limit", float64(t.abuserAllowed) <= 1.2*allowedMax, "%d allowed, limit %.0f", t.abuserAllowed, allowedMax)
	r.require(name+": RSS ≤ 400 MiB", rss <= 400<<20, "%d MiB", rss>>20)
	r.require(name+": no call dropped for its deadline while its caller waited", t.droppedWaiting == 0, "%d", t.droppedWaiting)
}

// phaseTally is what the callers of one phase got.
type phaseTally struct {
	inTime     int // answered, a decision, within the deadline
	late       int // answered, but read after the deadline
	failedOpen int // answered in time, degraded and not shed: the limiter failed open
	shed       int
	overloaded int // answered UNAVAILABLE by the entry gate within the deadline
	// droppedWaiting: answered as past its deadline while its caller
	// still waited (an invariant: 0).
	droppedWaiting int
	abuserAllowed  int
	// crit is each critical call's latency, sorted (one not answered in
	// time counts as at least the deadline); critArrived the same at the
	// caller's socket where its receive time is known (arrivals: some was).
	crit, critArrived []time.Duration
	arrivals          bool
	critInTime        int
	critMissedFirst   int // critical calls not answered in time, sent in the phase's first second
	// critGaveUp: critical calls this process gave up on at their
	// deadline; critGaveUpInTime: those whose answer had reached its
	// socket within the deadline (read late by this process).
	critGaveUp, critGaveUpInTime int
}

// tallyPhase counts checks of a phase that began at began, abuser's
// admissions among them. after are the critical calls given up on whose
// answers came anyway (Load.AnsweredAfterGivingUp).
func tallyPhase(checks, after []Check, abuser events.Principal, began time.Time) phaseTally {
	var t phaseTally
	var gaveUp []time.Duration // critical calls given up on, as long as the caller waited
	for _, c := range checks {
		if c.OK && c.Latency > overloadDeadline {
			// Read after the caller's deadline: only a starved generator
			// does (a gateway would have failed open by itself). Not one
			// the caller acted on, so not in the failed-open share.
			t.late++
		} else if c.OK && c.Degraded && !c.Shed {
			t.failedOpen++
		}
		if c.OK && c.Shed {
			t.shed++
		}
		if c.Overloaded && c.Latency <= overloadDeadline {
			t.overloaded++
		}
		if c.OK && c.Allowed && c.Principal == abuser {
			t.abuserAllowed++
		}
		if answeredInTime(c) {
			t.inTime++
		}
		if c.OK && c.Dropped && c.Latency <= overloadDeadline {
			// A "deadline exceeded" answer read after the caller's own
			// deadline is one this process took late (its core starved,
			// the runtime saw the socket ready before the read timer):
			// the caller was no longer waiting.
			t.droppedWaiting++
		}
		if c.Priority == "critical" {
			if answeredInTime(c) {
				t.critInTime++
			} else if c.Start.Before(began.Add(time.Second)) {
				t.critMissedFirst++
			}
			lat := c.Latency
			if !c.OK {
				lat = max(lat, overloadDeadline) // no answer: as late as the caller waited
			}
			t.crit = append(t.crit, lat)
			// The same at the caller's socket: an answer in time, at its
			// arrival there; any other, as above (those given up on below).
			switch {
			case answeredInTime(c) && c.Arrival > 0:
				lat, t.arrivals = c.Arrival, true
			case c.GaveUp:
				gaveUp = append(gaveUp, lat)
				continue
			}
			t.critArrived = append(t.critArrived, lat)
		}
	}
	// A call given up on whose answer reached the socket anyway counts
	// at that answer's arrival: the limiter's answer, which this process
	// read late. Each takes the place of one given up on (the shortest
	// wait: the tail keeps the longest); the others stay as the caller
	// waited.
	t.critGaveUp = len(gaveUp)
	slices.Sort(gaveUp)
	for _, c := range after {
		if len(gaveUp) == 0 {
			break
		}
		if !c.OK || c.Arrival <= 0 {
			continue
		}
		gaveUp = gaveUp[1:]
		t.critArrived, t.arrivals = append(t.critArrived, c.Arrival), true
		if c.Arrival <= overloadDeadline {
			t.critGaveUpInTime++
		}
	}
	t.critArrived = append(t.critArrived, gaveUp...)
	slices.Sort(t.crit)
	slices.Sort(t.critArrived)
	return t
}

// quantile is the q-th percentile of sorted d (0 when empty).
func quantile(d []time.Duration, q int) time.Duration {
	if len(d) == 0 {
		return 0
	}
	return d[min(len(d)-1, len(d)*q/100)]
}
