package chaos

// The overload scenarios' capacity search: the limiter's saturation for the
// open-loop phases' own traffic, measured in the run.

import (
	"context"
	"fmt"
	"time"
)

// The open-loop capacity search (capacity): offered rates from
// capacityFrom of the closed loop's saturation, each capacityRise times the
// last, at most capacitySteps of them, each as long as an open-loop phase
// and measured as one (capacityStepOf); the knee is the highest rate
// answered capacityInTime within the deadline.
const (
	capacityFrom   = 0.3
	capacityRise   = 1.25
	capacitySteps  = 12
	capacityInTime = 0.95
)

// capacityStepResult is one step of the capacity search: calls sent and
// answered within the deadline over span, and the limiter's CPU time over it.
type capacityStepResult struct {
	rate, sent, inTime int
	span, cpu          time.Duration
}

// capacity offers rising rates (capacityFrom of closed, then ×capacityRise
// each step), measured by step, until the answers within the deadline per
// second stop rising (two steps in a row that add less than 2 %) or
// capacitySteps have run, and returns the most of them any step had — the
// limiter's saturation for that traffic —, the rate offered in that step
// (the first such step), and a note per step, the knee marked.
//
// The most of several noisy steps is biased upward (the best of them is
// partly luck): the overload scenarios offer that saturation again as a
// rate, interleaved with each open-loop phase's, for a figure without that
// bias (overloadRun.interleaved).
func capacity(closed float64, step func(rate int) (capacityStepResult, error)) (float64, int, []string, error) {
	var notes []string
	best, bestRate, knee, flat := 0.0, 0, -1, 0
	for i, f := 0, capacityFrom; i < capacitySteps && flat < 2; i, f = i+1, f*capacityRise {
		m, err := step(max(int(f*closed), 1))
		if err != nil {
			return 0, 0, notes, err
		}
		goodput := float64(m.inTime) / max(m.span.Seconds(), 0.001)
		share := float64(m.inTime) / float64(max(m.sent, 1))
		if share >= capacityInTime {
			knee = i
		}
		notes = append(notes, fmt.Sprintf("%d/s offered, %.1f %% within the deadline (%.0f/s, %.0f µs of limiter CPU each)",
			m.rate, 100*share, goodput, float64(m.cpu.Microseconds())/float64(max(m.inTime, 1))))
		if goodput < 1.02*best {
			flat++
		} else {
			flat = 0
		}
		if goodput > best {
			best, bestRate = goodput, m.rate
		}
	}
	if knee >= 0 {
		notes[knee] += fmt.Sprintf(" — the knee: the highest rate answered ≥ %.0f %% within the deadline", 100*capacityInTime)
	}
	return best, bestRate, notes, nil
}

// capacityStepOf runs load for d and measures it as an open-loop phase is
// measured: every call it sent, over the time from its start to its stop.
// limCPU is the limiter's CPU time so far; open readies l before the clock
// starts (openForPhase).
func capacityStepOf(ctx context.Context, l *Load, d time.Duration, limCPU func() time.Duration, open func(*Load) error) (capacityStepResult, error) {
	if err := open(l); err != nil {
		return capacityStepResult{rate: l.Rate}, err
	}
	start, cpu0 := time.Now(), limCPU()
	stop := startLoad(ctx, l)
	_ = sleep(ctx, d)
	stop()
	m := capacityStepResult{rate: l.Rate, span: time.Since(start), cpu: limCPU() - cpu0}
	if err := l.Err(); err != nil {
		return m, err
	}
	if err := ctx.Err(); err != nil {
		return m, err
	}
	for _, c := range l.Results() {
		m.sent++
		if answeredInTime(c) {
			m.inTime++
		}
	}
	return m, nil
}
