package main

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
	"github.com/floodgate-dev/floodgate/loadtest/internal/cpusplit"
	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
	"github.com/floodgate-dev/floodgate/loadtest/internal/openloop"
)

// regime is how a round offers its calls: closed loop (callers at once,
// each calling again as soon as it is answered: saturation) or open loop
// (rate calls/s on a fixed schedule, at most callers in flight, each
// latency from its call's due time, so a service that falls behind is
// charged for the wait). Every service is offered the same in a regime.
type regime struct {
	rate           float64 // calls/s offered; 0: closed loop
	callers, conns int
	users          int
	d              time.Duration
	quota          float64 // closed loop: each service's CPU quota in cores (placement.limit); 0: none
}

func (g regime) String() string {
	if g.rate > 0 {
		return fmt.Sprintf("open loop at %.0f calls/s offered to every service, at most %d in flight on %d connections, %d users, 100/s fixed window", g.rate, g.callers, g.conns, g.users)
	}
	s := fmt.Sprintf("%d callers on %d connections, %d users, 100/s fixed window", g.callers, g.conns, g.users)
	if g.quota > 0 {
		s += fmt.Sprintf(", each service under a CPU quota of %.2f core per %s", g.quota, quotaPeriod)
	}
	return s
}

// An open-loop round kept to its schedule when it achieved at least
// behindMin of the offered calls/s and its median call was answered within
// behindP50 of its due time. The second catches a service at its
// saturation: it can make nearly every call by the round's end yet answer
// each hundreds of ms late, queued behind the others (a service that keeps
// up answers the median call in about 1 ms in these runs; with 64 callers
// at once in the closed loop, in 1–5 ms).
const (
	behindMin = 0.99
	behindP50 = 10 * time.Millisecond
)

// offer makes one round's calls and returns their latencies, sorted, and
// how many failed.
func (g regime) offer(ctx context.Context, call callFunc) ([]time.Duration, int64) {
	if g.rate > 0 {
		rngs := make([]*rand.Rand, g.callers)
		for w := range rngs {
			rngs[w] = rand.New(rand.NewPCG(uint64(w), 11))
		}
		return openloop.Run(g.rate, g.d, g.callers, func(w int) error { return call(ctx, w, rngs[w].IntN(g.users)) })
	}
	var errs atomic.Int64
	lats := make([][]time.Duration, g.callers)
	end := time.Now().Add(g.d)
	var wg sync.WaitGroup
	for i := range g.callers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for time.Now().Before(end) {
				t0 := time.Now()
				if err := call(ctx, i, rng.IntN(g.users)); err != nil {
					errs.Add(1)
				}
				lats[i] = append(lats[i], time.Since(t0))
			}
		}()
	}
	wg.Wait()
	lat := slices.Concat(lats...)
	slices.Sort(lat)
	return lat, errs.Load()
}

// callFunc is one call of a protocol against a target (user in, error out;
// an over-limit answer is not an error).
type callFunc = func(ctx context.Context, worker, user int) error

type result struct {
	name     string
	round    int // 1, 2, …
	offered  float64
	calls    int64
	errors   int64
	duration time.Duration
	cpu      time.Duration    // the load generator's own CPU time in the round
	procs    [3]time.Duration // CPU time of the service, Redis and the broker in the round
	lat      []time.Duration
	busy     []float64 // each core's busy share over the round (/proc/stat)
	invalid  bool      // the generator's cores were over genBusyMax busy (favoured: by the harness)
	quota    float64   // the service's CPU quota in cores (-quota); 0: none
	// throttled is how many quota periods of the round stopped the service
	// short (cgroup cpu.stat nr_throttled).
	throttled int64
	// probe is the CPU time the speed probe took on the service's cores just
	// before the round (cputime.Probe; 0: not pinned): the same work takes
	// more when the core runs slower, and so does every call.
	probe time.Duration
}

// quotaMin is the least share of its quota a service under -quota must use
// for its round to have measured it saturated. CFS bandwidth control at a
// 4 ms period gives a saturated service a little less than its quota: the
// services here, every one throttled in most periods, used 89–100 % of 0.3
// and 0.6 core (2026-11-30).
const quotaMin = 0.85

// short: a round under a quota whose service did not use most of it, so
// the callers, not the quota, set its pace.
func (r result) short() bool {
	return r.quota > 0 && r.procs[0].Seconds()/r.duration.Seconds() < quotaMin*r.quota
}

// busyOf is the busiest of cpus over the round.
func (r result) busyOf(cpus []int) float64 {
	m := 0.0
	for _, c := range cpus {
		if c < len(r.busy) {
			m = max(m, r.busy[c])
		}
	}
	return m
}

// achieved is the round's calls/s.
func (r result) achieved() float64 { return float64(r.calls) / r.duration.Seconds() }

// behind: an open-loop round whose service did not keep to the schedule.
func (r result) behind() bool {
	return r.offered > 0 && (r.achieved() < behindMin*r.offered || openloop.Quantile(r.lat, 0.5) > behindP50)
}

// genBusyMax is the busiest the generator's cores may be in a valid round:
// beyond it the generator, not the service, may set the pace. Favoured,
// the share is the run's own processes' there (the generator, Redis and
// the broker: the harness), as the chaos overload scenario counts it — the
// machine's other work fills those cores too, but only in what the
// harness leaves.
const genBusyMax = 0.90

// harnessShare is the share of the rest's cores the generator, Redis and
// the broker used in the round.
func (r result) harnessShare(rest []int) float64 {
	return (r.cpu + r.procs[1] + r.procs[2]).Seconds() / r.duration.Seconds() / float64(max(len(rest), 1))
}

// load runs one round of the regime against t and measures it: the
// generator's, the service's, Redis's and the broker's CPU time and each
// core's busy share over the round.
func load(ctx context.Context, t target, call callFunc, g regime) result {
	warm(ctx, call, g.callers)
	start, cpu0, procs0 := time.Now(), cputime.Self(), t.pids.cpu()
	busy0, total0 := cputime.CoreTimes()
	lat, errs := g.offer(ctx, call)
	elapsed, cpu, procs := time.Since(start), cputime.Self()-cpu0, t.pids.cpu()
	busy1, total1 := cputime.CoreTimes()
	for i := range procs {
		procs[i] -= procs0[i]
	}
	return result{name: t.name, offered: g.rate, calls: int64(len(lat)), errors: errs, duration: elapsed, cpu: cpu, procs: procs, lat: lat,
		busy: cputime.CoreBusy(busy0, total0, busy1, total1)}
}

// compare runs alternating rounds of the regime against the targets over
// one protocol (each round's service alone on the service cores, every
// other process on the rest's) and prints the per-round figures, the
// summary table and the ratios. A round whose generator cores were over
// 90 % busy (favoured: 90 % used by the generator, Redis and the broker)
// is INVALID and left out of the sums, unless every round of the service
// was; an open-loop round that achieved under 99 % of the offered calls/s,
// or answered its median call over 10 ms after its due time, fell BEHIND
// its schedule, and its row says so.
func compare(ctx context.Context, proto string, targets []target, domain string, g regime, rounds int, place placement, all []int, prof profiler) (envoypeer.Comparison, error) {
	results, err := measureRounds(ctx, proto, targets, domain, g, rounds, place, all, prof)
	if err != nil {
		return envoypeer.Comparison{}, err
	}
	return summarize(proto, targets, g, results), nil
}

// label names the regime's rounds in the output: "grpc", "grpc open loop".
func (g regime) label(proto string) string {
	if g.rate > 0 {
		return proto + " open loop"
	}
	return proto
}

func measureRounds(ctx context.Context, proto string, targets []target, domain string, g regime, rounds int, place placement, all []int, prof profiler) ([]result, error) {
	var results []result
	for r := 0; r < rounds; r++ {
		order := slices.Clone(targets)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, t := range order {
			if err := place.onlyUnderTest(t.pids.service, all); err != nil {
				return nil, err
			}
			var probe time.Duration
			if place.on {
				_, cpu, err := cputime.Probe(ctx, cpuList(place.service))
				if err != nil {
					return nil, err
				}
				probe = cpu
			}
			call, closeAll, err := caller(proto, t, domain, g.conns)
			if err != nil {
				return nil, err
			}
			var stopProf func() error
			if r == 0 {
				stopProf = prof.start(t.name, proto)
			}
			var unlimit func() (int64, error)
			if g.quota > 0 {
				if unlimit, err = place.limit(t.pids.service, g.quota); err != nil {
					closeAll()
					return nil, err
				}
			}
			res := load(ctx, t, call, g)
			closeAll()
			if unlimit != nil {
				if res.throttled, err = unlimit(); err != nil {
					return nil, err
				}
				res.quota = g.quota
			}
			res.round, res.probe = r+1, probe
			if stopProf != nil {
				if err := stopProf(); err != nil {
					return nil, err
				}
				perCall := float64(res.procs[0].Microseconds()) / float64(max(res.calls, 1))
				parts, err := cpusplit.File(prof.cpuPath(t.name, proto))
				if err != nil {
					return nil, err
				}
				fmt.Printf("%s round %d %s, where its %.1f µs of CPU per call went (its CPU profile over the round, loadtest/internal/cpusplit): %s\n",
					g.label(proto), r+1, t.name, perCall, cpusplit.PerCall(parts, perCall))
			}
			res.invalid = place.on && res.busyOf(place.rest) > genBusyMax
			if place.favoured {
				res.invalid = place.on && res.harnessShare(place.rest) > genBusyMax
			}
			results = append(results, res)
			fmt.Printf("%s round %d %-20s %s  %5.1f µs service CPU/call  p50 %-9s p99 %-9s errors %d  cores busy %s%s\n", g.label(proto), r+1, t.name,
				rateString(res), float64(res.procs[0].Microseconds())/float64(max(res.calls, 1)), q(res.lat, 0.5), q(res.lat, 0.99), res.errors, busyString(res.busy), roundMarks(res, place))
		}
	}
	return results, nil
}

// rateString is a round's calls/s, and in open loop the offered rate.
func rateString(res result) string {
	s := fmt.Sprintf("%8.0f calls/s", res.achieved())
	if res.offered > 0 {
		s += fmt.Sprintf(" of %.0f offered", res.offered)
	}
	return s
}

// roundMarks is what a round's line says after its figures: the speed
// probe, the service's share of its cores, the harness's or the generator
// cores' busy share, INVALID, and BEHIND when an open-loop round fell
// behind its schedule.
func roundMarks(res result, place placement) string {
	mark := ""
	switch {
	case res.invalid && place.favoured:
		mark = fmt.Sprintf("  INVALID: generator, Redis and broker used %.0f %% of cpu %s (the generator itself %.0f %%)", 100*res.harnessShare(place.rest), cpuList(place.rest),
			100*res.cpu.Seconds()/res.duration.Seconds()/float64(len(place.rest)))
	case place.favoured:
		mark = fmt.Sprintf("  harness %.0f %% of cpu %s", 100*res.harnessShare(place.rest), cpuList(place.rest))
	case res.invalid:
		// The generator's own share says whether it or the
		// machine's other tenants filled its cores.
		mark = fmt.Sprintf("  INVALID: generator cpu %s %.0f %% busy (the generator itself %.0f %% of it)", cpuList(place.rest), 100*res.busyOf(place.rest),
			100*res.cpu.Seconds()/res.duration.Seconds()/float64(len(place.rest)))
	}
	if place.on {
		// A saturated service short of its core shares it with
		// processes outside the run.
		mark = fmt.Sprintf("  service ran %.0f %% of cpu %s", 100*res.procs[0].Seconds()/res.duration.Seconds()/float64(len(place.service)), cpuList(place.service)) + mark
	}
	if res.quota > 0 {
		mark += fmt.Sprintf("  quota %.2f core, throttled in %d periods", res.quota, res.throttled)
	}
	if res.short() {
		mark += fmt.Sprintf("  SHORT of its quota: used %.0f %% of it, so the callers set its pace", 100*res.procs[0].Seconds()/res.duration.Seconds()/res.quota)
	}
	if res.behind() {
		mark += fmt.Sprintf("  BEHIND the schedule: achieved %.1f %% of the offered calls/s, median call %s after its due time", 100*res.achieved()/res.offered, q(res.lat, 0.5))
	}
	if res.probe > 0 {
		mark += fmt.Sprintf("  speed probe before it %.0f ms CPU", float64(res.probe.Microseconds())/1000)
	}
	return mark
}

// tally is what a service's rounds were: how many, which were INVALID,
// BEHIND or SHORT, and which the sums hold.
type tally struct {
	rounds, invalid, behind, short int
	used                           []int
}

// summarize sums each service's rounds (its valid ones, or all when none
// was), prints the table and the ratios, with the rounds they come from,
// and returns them.
func summarize(proto string, targets []target, g regime, results []result) envoypeer.Comparison {
	tallies := map[string]*tally{}
	for _, r := range results {
		n := tallies[r.name]
		if n == nil {
			n = &tally{}
			tallies[r.name] = n
		}
		n.rounds++
		if r.invalid {
			n.invalid++
		}
		if r.behind() {
			n.behind++
		}
		if r.short() {
			n.short++
		}
	}
	sum := map[string]*result{}
	for _, r := range results {
		n := tallies[r.name]
		if r.invalid && n.invalid < n.rounds {
			continue // a valid round of the service exists: this one is left out
		}
		n.used = append(n.used, r.round)
		s := sum[r.name]
		if s == nil {
			s = &result{name: r.name}
			sum[r.name] = s
		}
		s.calls += r.calls
		s.errors += r.errors
		s.duration += r.duration
		s.cpu += r.cpu
		for i := range s.procs {
			s.procs[i] += r.procs[i]
		}
		s.lat = append(s.lat, r.lat...)
		if s.busy == nil {
			s.busy = make([]float64, len(r.busy))
		}
		for i := range min(len(s.busy), len(r.busy)) {
			s.busy[i] += r.busy[i] * r.duration.Seconds()
		}
	}
	c := envoypeer.Comparison{Protocol: proto, Offered: g.rate}
	fmt.Printf("\n%s: %s\n| service | calls/s | p50 | p99 | p99.9 | errors | load generator CPU | CPU µs per call: service + Redis + broker + generator | calls per service core-second | cores busy | rounds (invalid) |\n|---|---|---|---|---|---|---|---|---|---|---|\n",
		g.label(proto), g)
	for _, t := range targets {
		s := sum[t.name]
		slices.Sort(s.lat)
		for i := range s.busy {
			s.busy[i] /= s.duration.Seconds()
		}
		n := tallies[t.name]
		sr := envoypeer.ServiceResult{Name: s.name, Calls: s.calls, Errors: s.errors, CallsPerSec: float64(s.calls) / s.duration.Seconds(),
			P50Ms: msOf(q(s.lat, 0.5)), P99Ms: msOf(q(s.lat, 0.99)), P999Ms: msOf(q(s.lat, 0.999)),
			LoadgenCPU: s.cpu.Seconds() / (s.duration.Seconds() * float64(runtime.NumCPU())),
			Rounds:     n.rounds, Invalid: n.invalid, AllInvalid: n.invalid == n.rounds, Behind: n.behind, CoreBusy: s.busy}
		perCall := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(max(s.calls, 1)) }
		sr.CPU = envoypeer.CallCPU{Service: perCall(s.procs[0]), Redis: perCall(s.procs[1]), Broker: perCall(s.procs[2]), Generator: perCall(s.cpu)}
		c.Services = append(c.Services, sr)
		inv := fmt.Sprintf("%d (%d)", n.rounds, n.invalid)
		if sr.AllInvalid {
			inv += " ALL INVALID"
		}
		if n.behind > 0 {
			inv += fmt.Sprintf(" BEHIND the schedule in %d", n.behind)
		}
		if n.short > 0 {
			inv += fmt.Sprintf(" SHORT of the quota in %d", n.short)
		}
		fmt.Printf("| %s | %.0f | %s | %s | %s | %d | %.0f %% | %.1f + %.1f + %.1f + %.1f = %.1f | %.0f | %s | %s |\n", s.name, sr.CallsPerSec, q(s.lat, 0.5), q(s.lat, 0.99), q(s.lat, 0.999), s.errors, 100*sr.LoadgenCPU,
			sr.CPU.Service, sr.CPU.Redis, sr.CPU.Broker, sr.CPU.Generator, sr.CPU.Total(), sr.PerCoreSecond(), busyString(sr.CoreBusy), inv)
	}
	e, f := sum["envoy ratelimit"], sum["floodgate"]
	c.Ratio = (float64(f.calls) / f.duration.Seconds()) / (float64(e.calls) / e.duration.Seconds())
	if g.rate > 0 {
		fmt.Printf("\n%s, each service offered the same calls: floodgate achieved %.0f calls/s, envoy ratelimit %.0f\n", g.label(proto), c.Services[1].CallsPerSec, c.Services[0].CallsPerSec)
	} else {
		fmt.Printf("\nratio floodgate / envoy ratelimit over %s: %.2f× in calls/s (%s)\n", proto, c.Ratio, g)
	}
	ratios(&c)
	fmt.Printf("%s\n\n", sources(targets, tallies))
	return c
}

// ratios prints and sets the per core-second ratios: Floodgate against
// envoy ratelimit, each floor and the baseline.
func ratios(c *envoypeer.Comparison) {
	es, fs := c.Services[0].CPU, c.Services[1].CPU
	c.ServiceCPURatio = es.Service / max(fs.Service, 1e-9)
	fmt.Printf("service CPU per call, envoy ratelimit / floodgate: %.1f / %.1f µs = %.2f× per core-second (machine CPU per call: %.0f / %.0f µs)\n",
		es.Service, fs.Service, c.ServiceCPURatio, es.Total(), fs.Total())
	for _, sr := range c.Services[2:] {
		switch sr.Name {
		case floorName, fastFloorName, fastHTTPFloorName:
			perCore := sr.CPU.Service / max(fs.Service, 1e-9)
			if sr.Name == floorName {
				c.FloorCPURatio = perCore
			}
			fmt.Printf("service CPU per call, %s / floodgate: %.1f / %.1f µs: floodgate costs %.2f× it (per core-second %.2f× of it; envoy ratelimit costs %.2f× it)\n",
				sr.Name, sr.CPU.Service, fs.Service, fs.Service/max(sr.CPU.Service, 1e-9), perCore, es.Service/max(sr.CPU.Service, 1e-9))
		case baselineName:
			fmt.Printf("service CPU per call, baseline / floodgate: %.1f / %.1f µs = %.2f× (envoy ratelimit / baseline %.2f×)\n",
				sr.CPU.Service, fs.Service, sr.CPU.Service/max(fs.Service, 1e-9), es.Service/max(sr.CPU.Service, 1e-9))
		}
	}
}

// sources says which rounds the sums, and so the ratios, come from.
func sources(targets []target, tallies map[string]*tally) string {
	parts := make([]string, len(targets))
	valid := true
	for i, t := range targets {
		n := tallies[t.name]
		rs := make([]string, len(n.used))
		for j, r := range n.used {
			rs[j] = fmt.Sprint(r)
		}
		parts[i] = t.name + " " + strings.Join(rs, ",")
		if n.invalid == n.rounds && n.invalid > 0 {
			parts[i] += " (every one INVALID)"
			valid = false
		}
	}
	if valid {
		return "figures and ratios from valid rounds only: " + strings.Join(parts, "; ")
	}
	return "figures and ratios NOT all from valid rounds: " + strings.Join(parts, "; ")
}

// warm makes one call from each of n callers at once, so that every
// connection the round will use is dialed before its clock starts (calls
// one after another would all ride one HTTP connection).
func warm(ctx context.Context, call callFunc, n int) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = call(ctx, i, 0)
		}()
	}
	wg.Wait()
}

// busyString prints each core's busy share: "cpu0 95 % cpu1 78 %".
func busyString(b []float64) string {
	parts := make([]string, len(b))
	for i, v := range b {
		parts[i] = fmt.Sprintf("cpu%d %.0f %%", i, 100*v)
	}
	return strings.Join(parts, " ")
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

func q(lat []time.Duration, f float64) time.Duration {
	return openloop.Quantile(lat, f).Round(10 * time.Microsecond)
}
