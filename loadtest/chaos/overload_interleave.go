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
	"strings"
	"time"

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
	return out, nil
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
