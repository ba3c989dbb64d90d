// Package schedwait reads a Go runtime execution trace and measures how
// long goroutines waited to run once they were runnable, by what they had
// been waiting for: the network (woken by the runtime's network poller,
// which a saturated process checks only when its run queues run dry or
// from sysmon, and whose wakes join the back of the global run queue), a
// timer, a channel or lock (woken by another goroutine, usually into the
// run queue's next slot), a yield (runtime.Gosched, to the back of the
// global queue) or a new goroutine. go tool trace -pprof=sched gives the
// total by stack; this splits it by how the goroutine was woken, which is
// what decides where it waits.
package schedwait

import (
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
	"time"

	"golang.org/x/exp/trace"
)

// Kinds of wake, as Class.Kind.
const (
	KindNetwork = "network" // blocked on a socket: the network poller woke it
	KindTimer   = "sleep"   // time.Sleep: a timer woke it
	KindYield   = "yield"   // runtime.Gosched or preempted
	KindNew     = "new"     // a goroutine just started
	KindBefore  = "blocked before the trace"

	// GapMin is the shortest stretch without an event counted in
	// Report.Gaps: a busy process emits events every few µs.
	GapMin = 200 * time.Microsecond
	// Any other Kind is the runtime's reason for the block ("chan
	// receive", "select", "sync", …): another goroutine woke it.
)

// Class is the waits of the goroutines woken one way from one place.
type Class struct {
	Kind  string          // how it was woken (Kind*, or the runtime's block reason)
	Where string          // the first two frames of the block outside the runtime and the standard library's I/O
	Waits []time.Duration // sorted
}

// Quantile returns the q-th quantile (0..1) of c's waits.
func (c Class) Quantile(q float64) time.Duration {
	if len(c.Waits) == 0 {
		return 0
	}
	return c.Waits[int(q*float64(len(c.Waits)-1))]
}

// Sum is the waits' total.
func (c Class) Sum() time.Duration {
	var s time.Duration
	for _, w := range c.Waits {
		s += w
	}
	return s
}

// Report is a trace's waits.
type Report struct {
	Span time.Duration // from the trace's first event to its last
	// Gaps are the stretches of the trace over GapMin with no event at
	// all: the process neither ran nor was woken (off the CPU, throttled
	// or preempted by a neighbour, or idle). Kind "no event".
	Gaps    Class
	Classes []Class // the most waited first
}

// ByKind merges r's classes by Kind, the most waited first.
func (r Report) ByKind() []Class {
	m := map[string]*Class{}
	for _, c := range r.Classes {
		k := m[c.Kind]
		if k == nil {
			k = &Class{Kind: c.Kind}
			m[c.Kind] = k
		}
		k.Waits = append(k.Waits, c.Waits...)
	}
	out := make([]Class, 0, len(m))
	for _, c := range m {
		slices.Sort(c.Waits)
		out = append(out, *c)
	}
	sortClasses(out)
	return out
}

func sortClasses(cs []Class) {
	slices.SortFunc(cs, func(a, b Class) int {
		if d := b.Sum() - a.Sum(); d != 0 {
			if d > 0 {
				return 1
			}
			return -1
		}
		return strings.Compare(a.Kind+a.Where, b.Kind+b.Where)
	})
}

// Read reads a trace (GET /debug/pprof/trace) and measures its waits.
func Read(r io.Reader) (Report, error) {
	tr, err := trace.NewReader(r)
	if err != nil {
		return Report{}, fmt.Errorf("schedwait: %w", err)
	}
	type g struct {
		kind, where string
		ready       trace.Time
		runnable    bool
	}
	gs := map[trace.GoID]*g{}
	classes := map[[2]string]*Class{}
	var first, last trace.Time
	var gaps []time.Duration
	for {
		ev, err := tr.ReadEvent()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return Report{}, fmt.Errorf("schedwait: %w", err)
		}
		if first == 0 {
			first = ev.Time()
		}
		if gap := time.Duration(ev.Time() - last); last != 0 && gap > GapMin {
			gaps = append(gaps, gap)
		}
		last = ev.Time()
		if ev.Kind() != trace.EventStateTransition {
			continue
		}
		st := ev.StateTransition()
		if st.Resource.Kind != trace.ResourceGoroutine {
			continue
		}
		id := st.Resource.Goroutine()
		from, to := st.Goroutine()
		s := gs[id]
		if s == nil {
			s = &g{}
			gs[id] = s
		}
		switch {
		case to == trace.GoWaiting && from == trace.GoWaiting:
			// the trace restating a state at a generation's start
		case to == trace.GoWaiting && from == trace.GoUndetermined:
			s.kind, s.where, s.runnable = KindBefore, "", false
		case to == trace.GoWaiting:
			s.kind, s.where, s.runnable = blockKind(st.Reason), where(st.Stack), false
		case to == trace.GoRunnable:
			switch from {
			case trace.GoRunning:
				s.kind, s.where = KindYield, where(st.Stack)
			case trace.GoNotExist:
				s.kind, s.where = KindNew, where(ev.Stack())
			case trace.GoWaiting:
			default:
				continue // in the trace's first moments, or back from a system call
			}
			if s.kind == "" {
				continue // blocked before the trace began
			}
			s.ready, s.runnable = ev.Time(), true
		case to == trace.GoRunning && from == trace.GoRunnable && s.runnable:
			s.runnable = false
			k := [2]string{s.kind, s.where}
			c := classes[k]
			if c == nil {
				c = &Class{Kind: s.kind, Where: s.where}
				classes[k] = c
			}
			c.Waits = append(c.Waits, time.Duration(ev.Time()-s.ready))
		default:
			if to != trace.GoRunning {
				s.runnable = false
			}
		}
	}
	slices.Sort(gaps)
	out := Report{Span: time.Duration(last - first), Gaps: Class{Kind: "no event", Waits: gaps}}
	for _, c := range classes {
		slices.Sort(c.Waits)
		out.Classes = append(out.Classes, *c)
	}
	sortClasses(out.Classes)
	return out, nil
}

// blockKind names a block by the runtime's reason for it.
func blockKind(reason string) string {
	switch {
	case reason == "network":
		return KindNetwork
	case reason == "sleep":
		return KindTimer
	case reason == "":
		return "other"
	}
	return reason
}

// where is the first two frames of s outside the runtime, sync, syscall,
// net, time and internal packages, without their import paths.
func where(s trace.Stack) string {
	var out []string
	for f := range s.Frames() {
		fn := f.Func
		if skipped(fn) {
			continue
		}
		out = append(out, fn[strings.LastIndex(fn, "/")+1:])
		if len(out) == 2 {
			break
		}
	}
	return strings.Join(out, " < ")
}

func skipped(fn string) bool {
	for _, p := range []string{"runtime.", "internal/", "sync.", "syscall.", "net.", "time.", "os.", "bufio.", "io."} {
		if strings.HasPrefix(fn, p) {
			return true
		}
	}
	return false
}

// Line is r by kind, for a result line: each kind's wakes and waits.
func (r Report) Line() string {
	var parts []string
	for _, c := range r.ByKind() {
		parts = append(parts, fmt.Sprintf("%s %d (p50 %s, p90 %s, p99 %s)", c.Kind, len(c.Waits), ms(c.Quantile(.5)), ms(c.Quantile(.9)), ms(c.Quantile(.99))))
	}
	return fmt.Sprintf("over %s: %s; %s", ms(r.Span), strings.Join(parts, ", "), r.GapLine())
}

// GapLine says how much of the trace had no event (Gaps).
func (r Report) GapLine() string {
	g := r.Gaps
	if len(g.Waits) == 0 {
		return "no stretch without an event over " + GapMin.String()
	}
	return fmt.Sprintf("no event for %.0f %% of it, in %d stretches over %s (p50 %s, p90 %s, longest %s)",
		100*float64(g.Sum())/float64(max(r.Span, 1)), len(g.Waits), GapMin, ms(g.Quantile(.5)), ms(g.Quantile(.9)), ms(g.Quantile(1)))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.2f ms", float64(d)/1e6) }

// Bucket is one bar of a Histogram: N durations in [From, From+width).
type Bucket struct {
	From time.Duration
	N    int
}

// Histogram counts sorted ds in buckets of width, from 0 to the longest
// (empty buckets between included).
func Histogram(ds []time.Duration, width time.Duration) []Bucket {
	if len(ds) == 0 || width <= 0 {
		return nil
	}
	out := make([]Bucket, int(ds[len(ds)-1]/width)+1)
	for i := range out {
		out[i].From = time.Duration(i) * width
	}
	for _, d := range ds {
		out[int(d/width)].N++
	}
	return out
}
