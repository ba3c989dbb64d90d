package chaos

// Overload judged against saturation with the rates interleaved: the
// machine's speed moves within a run (core 1's probe took 187–311 ms of CPU
// for the same work within minutes on 2026-12-02, and the hypervisor
// reports no steal), so phases measured one after another compare the
// machine's moments as much as the rates. Taking turns every interleaveSlice
// gives each rate the same moments.

import (
	"context"
	"fmt"
	"path/filepath"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cpusplit"
	"github.com/floodgate-dev/floodgate/loadtest/internal/perfsplit"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// The interleaved phase: interleaveRounds turns of each rate, interleaveSlice
// each; the first interleaveGuard of each slice is not counted (calls, CPU),
// so that no rate is measured on what the one before left: 5× the callers'
// deadline, past which no call of the last slice is still waiting.
const (
	interleaveSlice  = 2 * time.Second
	interleaveGuard  = 250 * time.Millisecond
	interleaveRounds = 5
)

// interleavedSpan is each rate's counted time in an interleaved phase.
const interleavedSpan = interleaveRounds * (interleaveSlice - interleaveGuard)

// interleavedRate is one rate's share of an interleaved phase.
type interleavedRate struct {
	rate   int
	inTime int           // answered within the deadline, in its counted time
	cpu    time.Duration // the limiters' CPU over its counted time
	// perf's samples of the limiters in its counted time (Size.Perf; nil:
	// not sampled), and why there are none when sampling failed.
	stacks  perfsplit.Stacks
	perfErr error
}

func (m interleavedRate) goodput() float64 { return float64(m.inTime) / interleavedSpan.Seconds() }

func (m interleavedRate) perCoreSecond() float64 {
	return float64(m.inTime) / max(m.cpu.Seconds(), 0.01)
}

// interleaved offers rates in turn, interleaveSlice each, interleaveRounds
// times over, and measures each rate over its slices, the first
// interleaveGuard of each left out. The phase as a whole (name) is held to
// the overload invariants, as the others are.
func (o *overloadRun) interleaved(ctx context.Context, name string, rates []int, abuser events.Principal) ([]interleavedRate, error) {
	load := o.openLoad(rates[0], abuser)
	load.Rates, load.Slice = rates, interleaveSlice
	if err := o.open(ctx, load); err != nil {
		return nil, err
	}
	n := interleaveRounds * len(rates)
	// The limiters' CPU at each slice's guard's end and at its end.
	type mark struct{ counted, end time.Duration }
	marks := make([]mark, n)
	rec, perfErr := o.startPerf(name)
	stop := startLoad(ctx, load)
	var start time.Time
	for start = load.Started(); start.IsZero(); start = load.Started() {
		if err := sleep(ctx, time.Millisecond); err != nil {
			stop()
			return nil, err
		}
	}
	for k := range n {
		from := start.Add(time.Duration(k) * interleaveSlice)
		_ = sleep(ctx, time.Until(from.Add(interleaveGuard)))
		marks[k].counted = o.limCPU()
		_ = sleep(ctx, time.Until(from.Add(interleaveSlice)))
		marks[k].end = o.limCPU()
	}
	stop()
	if rec != nil {
		perfErr = rec.Stop()
	}
	if err := load.Err(); err != nil {
		return nil, err
	}
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	rss, err := o.peakRSS()
	if err != nil {
		return nil, err
	}
	checks := load.Results()
	requireInvariants(o.r, name, tallyPhase(checks, load.AnsweredAfterGivingUp(), abuser, start), abuserAllowedMax(time.Duration(n)*interleaveSlice), rss)
	out := make([]interleavedRate, len(rates))
	for i, r := range rates {
		out[i].rate = r
	}
	for k, m := range marks {
		out[k%len(rates)].cpu += m.end - m.counted
	}
	for _, c := range checks {
		at := c.Start.Sub(start)
		k := int(at / interleaveSlice)
		if at < 0 || k >= n || at-time.Duration(k)*interleaveSlice < interleaveGuard {
			continue
		}
		if answeredInTime(c) {
			out[k%len(rates)].inTime++
		}
	}
	if rec != nil && perfErr == nil {
		perfErr = splitPerf(ctx, rec, start, out)
	}
	for i := range out {
		out[i].perfErr = perfErr
	}
	return out, nil
}

// startPerf starts perf on the limiters for the interleaved phase name
// (Size.Perf; nil and no error: not asked for).
func (o *overloadRun) startPerf(name string) (*perfsplit.Recording, error) {
	if o.perfHz <= 0 {
		return nil, nil
	}
	pids := make([]int, len(o.limiters))
	for i, l := range o.limiters {
		pids[i] = l.Pid()
	}
	return perfsplit.Record(o.perfHz, o.perfPath(name), pids...)
}

// perfPath is where the interleaved phase name's perf recording goes.
func (o *overloadRun) perfPath(name string) string {
	return filepath.Join(o.profiles, strings.ReplaceAll(strings.ReplaceAll(name, " #", "-"), " ", "-")+"-limiters.perf.data")
}

// splitPerf sorts the recording's samples into the rates' counted slices
// (those of out[i] are rounds of slice i) and writes each rate's as
// folded stacks beside the recording.
func splitPerf(ctx context.Context, rec *perfsplit.Recording, start time.Time, out []interleavedRate) error {
	mono, err := perfsplit.MonoClock()
	if err != nil {
		return err
	}
	var ws []perfsplit.Window
	for k := range interleaveRounds * len(out) {
		from := start.Add(time.Duration(k) * interleaveSlice)
		ws = append(ws, perfsplit.Window{From: mono(from.Add(interleaveGuard)), To: mono(from.Add(interleaveSlice)), Key: k % len(out)})
	}
	split, err := rec.Split(ctx, ws)
	if err != nil {
		return err
	}
	for i := range out {
		out[i].stacks = split[i]
		if err := perfsplit.WriteFolded(fmt.Sprintf("%s-%d.folded", strings.TrimSuffix(rec.Path, ".perf.data"), out[i].rate), split[i]); err != nil {
			return err
		}
	}
	return nil
}

// interleavedPerfNote says where the limiters' CPU per answer within the
// deadline went at each rate (cpusplit's parts of perf's samples in the
// rate's slices), and which functions' grew most from the next-to-last
// rate to the last.
func (o *overloadRun) interleavedPerfNote(name string, rs []interleavedRate, names []string) string {
	if err := rs[0].perfErr; err != nil {
		return fmt.Sprintf("perf: %v", err)
	}
	usPer := make([]float64, len(rs)) // µs of CPU one sample stands for, per answer
	parts := make([]string, len(rs))
	for i, m := range rs {
		var t cpusplit.Tally
		for chain, c := range m.stacks {
			t.Add(perfsplit.Frames(chain), int64(c))
		}
		perCall := float64(m.cpu.Microseconds()) / float64(max(m.inTime, 1))
		usPer[i] = perCall / float64(max(m.stacks.Samples(), 1))
		split, err := t.Parts()
		if err != nil {
			parts[i] = fmt.Sprintf("%s: %v", names[i], err)
			continue
		}
		parts[i] = fmt.Sprintf("%s %d samples, %s", names[i], m.stacks.Samples(), cpusplit.PerCall(split, perCall))
	}
	a, b := len(rs)-2, len(rs)-1
	var grew []string
	for _, g := range perfsplit.Grew(rs[a].stacks, rs[b].stacks, usPer[a], usPer[b], 8) {
		grew = append(grew, fmt.Sprintf("%s %.1f → %.1f", g.Func, g.A, g.B))
	}
	return fmt.Sprintf("perf at %d Hz over the counted slices (%s, folded stacks per rate beside it), µs of the limiters' CPU per answer within the deadline: %s; grew most from %s to %s (µs per answer, inclusive): %s",
		o.perfHz, o.perfPath(name), strings.Join(parts, "; "), names[a], names[b], strings.Join(grew, ", "))
}

// interleavedNote says what an interleaved phase gave each of its rates,
// named by names.
func interleavedNote(rs []interleavedRate, names []string) string {
	parts := make([]string, len(rs))
	for i, m := range rs {
		parts[i] = fmt.Sprintf("%s %d/s offered: %.0f/s within the deadline, %.0f per limiter core-second", names[i], m.rate, m.goodput(), m.perCoreSecond())
	}
	return fmt.Sprintf("%d rates in turn, %s each, %d rounds, the first %s of each slice not counted: %s",
		len(rs), interleaveSlice, interleaveRounds, interleaveGuard, strings.Join(parts, "; "))
}
