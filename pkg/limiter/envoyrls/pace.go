package envoyrls

// The entry gate's read side (WithReadPacing, pkg/grpcfast only): the
// connections read only while the gate's queue has room, newest first.
// Past saturation the door alone keeps reading every call to refuse it —
// over a thousand connections a read, an empty read and a write each,
// about a quarter of what deciding a call costs, which at 2× saturation
// leaves half the CPU for decisions. Paced, a connection whose socket has
// become readable waits for a turn; the turn goes to the connection that
// became readable last (its calls the freshest), when a call leaves the
// gate's queue. What is not read waits in the kernel, costs nothing, and
// is read later with the rest of its connection's backlog in one read —
// by then mostly calls and their resets (the caller gave up), dropped
// without a decision. A connection of a gateway's CRITICAL cluster
// (MetadataPriority) is not paced.

import (
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"google.golang.org/grpc/metadata"
)

// ReadMaxWait is the longest a paced connection waits for a turn: past it,
// it reads anyway, so that no connection goes unread (its PINGs and
// resets unanswered) for longer. What such a read brings is mostly stale
// (its callers gone), so it is rare: with 1 s instead, a 2× overload
// read a thousand connections' stale backlogs every second and answered
// fewer calls in time (31–34 % of saturation against 36–46 %, three
// alternated pairs; docs/chaos.md).
const ReadMaxWait = 10 * time.Second

// WithReadPacing paces the reads of the entry gate's connections
// (pkg/grpcfast's transport only; WithGate must be set): a grpcfast.ReadPacer
// of the gate's (pace.go).
func WithReadPacing(on bool) GRPCOption {
	return func(e *EnvoyRLS) { e.pace = on }
}

// pacer is the entry gate's grpcfast.ReadPacer: connections waiting for a
// turn, newest on top.
type pacer struct {
	g       *gate
	maxWait time.Duration
	n       atomic.Int64 // len(stack)
	granted atomic.Int64 // counted turns not yet ended: their calls are not in the queue yet
	transit atomic.Int64 // calls read, handed to a worker, not started: not in the queue yet either
	mu      sync.Mutex
	stack   []chan struct{}
	turns   *prometheus.CounterVec
	atOnce  prometheus.Counter
	given   prometheus.Counter
}

func newPacer(g *gate, maxWait time.Duration, reg prometheus.Registerer) *pacer {
	p := &pacer{g: g, maxWait: maxWait,
		turns: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_grpc_read_turns_total",
			Help: "Reads of a paced gRPC connection whose socket had become readable, by how the turn came (at_once: the gate's queue had room; given: a call left the queue; max_wait: the connection waited its longest; closing: it was closing)."},
			[]string{"how"})}
	p.atOnce, p.given = p.turns.WithLabelValues("at_once"), p.turns.WithLabelValues("given")
	if reg != nil {
		_ = reg.Register(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "floodgate_limiter_grpc_read_waiting",
			Help: "Paced gRPC connections waiting for a turn to read."}, func() float64 { return float64(p.n.Load()) }))
	}
	g.pacer = p
	return p
}

// room is how many more connections may read now: the gate reads while its
// queue, with the calls of the turns under way, holds less than half a
// round (as many calls as it lets through at once), so that a call is
// ready whenever one leaves and the queue's wait stays short. A turn under
// way counts until its connection has handled what it read, and each call
// it handed to a worker until the worker starts it: without that, every
// call leaving the queue gave turns again before the last ones' calls had
// reached it, and thousands of readers (or workers) waited for the CPU.
func (p *pacer) room() int64 {
	return max(1, p.g.lim.Limit()/2) - p.g.lim.Waiting() - p.granted.Load() - p.transit.Load()
}

// Turn waits for the connection's turn (grpcfast.ReadPacer); a turn given
// (at once or by kick) counts until Done.
func (p *pacer) Turn(done <-chan struct{}) bool {
	if p.n.Load() == 0 && p.room() > 0 {
		p.granted.Add(1)
		p.atOnce.Inc()
		return true
	}
	ch := make(chan struct{}, 1)
	p.mu.Lock()
	p.stack = append(p.stack, ch)
	p.n.Add(1)
	p.mu.Unlock()
	p.kick() // the queue may have room already
	t := time.NewTimer(p.maxWait)
	defer t.Stop()
	select {
	case <-ch:
		p.given.Inc()
		return true
	case <-t.C:
		return p.leave(ch, "max_wait")
	case <-done:
		return p.leave(ch, "closing")
	}
}

// Done ends a counted turn (grpcfast.ReadPacer): its calls are on their
// way to the queue, or were not calls. While the gate has calls it gives
// no turn itself: turns follow the calls that leave the queue (a kick here
// let reads feed reads faster than their calls reached the queue — with
// the queue full, it filled far past its limit; with it merely empty
// between calls, thousands of readers waited for the CPU). With the gate
// idle no call will leave it, so it gives the turns the room now has: a
// connection does not wait out ReadMaxWait after a burst.
func (p *pacer) Done() {
	p.granted.Add(-1)
	if p.g.lim.InFlight() == 0 && p.g.lim.Waiting() == 0 {
		p.kick()
	}
}

// Dispatched counts a call on its way to a worker (grpcfast.ReadPacer).
func (p *pacer) Dispatched() { p.transit.Add(1) }

// Started ends Dispatched's count: the call is about to enter the gate.
// While the gate is idle no call will leave it to give turns, so this
// gives them, as Done does.
func (p *pacer) Started() {
	p.transit.Add(-1)
	if p.g.lim.InFlight() == 0 && p.g.lim.Waiting() == 0 {
		p.kick()
	}
}

// leave takes ch off the stack; it reports whether ch was given a
// (counted) turn meanwhile after all.
func (p *pacer) leave(ch chan struct{}, how string) bool {
	p.mu.Lock()
	for i := len(p.stack) - 1; i >= 0; i-- {
		if p.stack[i] == ch {
			p.stack = append(p.stack[:i], p.stack[i+1:]...)
			p.n.Add(-1)
			p.mu.Unlock()
			p.turns.WithLabelValues(how).Inc()
			return false
		}
	}
	p.mu.Unlock()
	p.given.Inc()
	return true
}

// kick gives as many turns as the gate's queue has room for, newest
// first. The gate calls it whenever a call leaves its queue or its limit.
func (p *pacer) kick() {
	if p.n.Load() == 0 {
		return
	}
	p.mu.Lock()
	for len(p.stack) > 0 && p.room() > 0 {
		last := len(p.stack) - 1
		p.granted.Add(1)
		p.stack[last] <- struct{}{}
		p.stack[last] = nil
		p.stack = p.stack[:last]
		p.n.Add(-1)
	}
	p.mu.Unlock()
}

// Unpaced reports whether a call comes from a gateway's CRITICAL cluster
// (grpcfast.ReadPacer): its connection is read at once from then on.
func (p *pacer) Unpaced(md metadata.MD) bool { return criticalMetadata(md) }
