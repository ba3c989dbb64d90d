package candidate

import (
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
)

// impactCounts are one rules version's decisions in one phase, by priority,
// counted on the hot path (two atomic adds) and flushed to Redis by an
// ImpactFlusher.
type impactCounts struct {
	phase          string // rollout.PhaseShadow or rollout.PhaseEnforced
	total, blocked [admission.PriorityBulk + 1]atomic.Int64
	errors         atomic.Int64
	// classes are a shadow's paired counts by full class (priority, kind,
	// plan, route): the candidate's and its parent's verdicts on the same
	// decisions, at most maxImpactClasses of them; the rest count under the
	// route "other". A read lock and a map lookup on the hot path (a struct
	// key: nothing allocated), the write lock only for a new class.
	classMu sync.RWMutex
	classes map[rollout.FullClass]*pairedCounts
}

// pairedCounts are one full class's decisions and how many the candidate and
// the parent blocked: all of them, and (slice) those the candidate answered.
type pairedCounts struct {
	n, cand, parent        atomic.Int64
	sliceN, sliceC, sliceP atomic.Int64
}

// maxImpactClasses bounds the classes one version's shadow counts.
const maxImpactClasses = 512

// AddPaired counts a decision both the candidate (cand) and the enforced
// rules (parent) judged, by its full class; answered: the candidate's
// verdict was the answer (its step's slice).
func (c *impactCounts) AddPaired(p admission.Priority, req limiter.Request, plan string, cand, parent, answered bool) {
	fc := rollout.FullClass{Priority: p.String(), Kind: string(req.Principal.Kind), Plan: plan, Route: req.Route}
	c.classMu.RLock()
	pc := c.classes[fc]
	c.classMu.RUnlock()
	if pc == nil {
		c.classMu.Lock()
		if c.classes == nil {
			c.classes = map[rollout.FullClass]*pairedCounts{}
		}
		if _, ok := c.classes[fc]; !ok && len(c.classes) >= maxImpactClasses {
			fc.Route = "other"
		}
		if pc = c.classes[fc]; pc == nil {
			pc = &pairedCounts{}
			c.classes[fc] = pc
		}
		c.classMu.Unlock()
	}
	pc.n.Add(1)
	if cand {
		pc.cand.Add(1)
	}
	if parent {
		pc.parent.Add(1)
	}
	if answered {
		pc.sliceN.Add(1)
		if cand {
			pc.sliceC.Add(1)
		}
		if parent {
			pc.sliceP.Add(1)
		}
	}
}

var (
	_ limiter.Impact = (*impactCounts)(nil)
	_ rollout.Tally  = (*impactCounts)(nil)
)

// Add counts one decision of priority p.
func (c *impactCounts) Add(p admission.Priority, blocked bool) {
	if p < admission.PriorityCritical || p > admission.PriorityBulk {
		return
	}
	c.total[p].Add(1)
	if blocked {
		c.blocked[p].Add(1)
	}
}

// AddError counts a check the version could not judge.
func (c *impactCounts) AddError() { c.errors.Add(1) }

// Take swaps the counts out, passing each to add (rollout.Tally).
func (c *impactCounts) Take(add func(field string, n int64)) (giveBack func()) {
	type takenClass struct {
		pc                     *pairedCounts
		n, cand, parent        int64
		sliceN, sliceC, sliceP int64
	}
	var (
		total, blocked [admission.PriorityBulk + 1]int64
		errors         int64
		classes        []takenClass
	)
	for p := admission.PriorityCritical; p <= admission.PriorityBulk; p++ {
		total[p], blocked[p] = c.total[p].Swap(0), c.blocked[p].Swap(0)
		if total[p] > 0 {
			add(rollout.CountField(c.phase, p.String(), false), total[p])
		}
		if blocked[p] > 0 {
			add(rollout.CountField(c.phase, p.String(), true), blocked[p])
		}
	}
	if errors = c.errors.Swap(0); errors > 0 {
		add(rollout.ErrorsField(c.phase), errors)
	}
	c.classMu.RLock()
	for fc, pc := range c.classes {
		tc := takenClass{pc: pc, n: pc.n.Swap(0), cand: pc.cand.Swap(0), parent: pc.parent.Swap(0),
			sliceN: pc.sliceN.Swap(0), sliceC: pc.sliceC.Swap(0), sliceP: pc.sliceP.Swap(0)}
		if tc.n == 0 {
			continue
		}
		for _, f := range [...]struct {
			what string
			n    int64
		}{{"n", tc.n}, {"cand", tc.cand}, {"parent", tc.parent},
			{rollout.SlicePrefix + "n", tc.sliceN}, {rollout.SlicePrefix + "cand", tc.sliceC}, {rollout.SlicePrefix + "parent", tc.sliceP}} {
			if f.n > 0 {
				add(rollout.ImpactClassField(f.what, fc), f.n)
			}
		}
		classes = append(classes, tc)
	}
	c.classMu.RUnlock()
	return func() {
		for p := admission.PriorityCritical; p <= admission.PriorityBulk; p++ {
			c.total[p].Add(total[p])
			c.blocked[p].Add(blocked[p])
		}
		c.errors.Add(errors)
		for _, tc := range classes {
			tc.pc.n.Add(tc.n)
			tc.pc.cand.Add(tc.cand)
			tc.pc.parent.Add(tc.parent)
			tc.pc.sliceN.Add(tc.sliceN)
			tc.pc.sliceC.Add(tc.sliceC)
			tc.pc.sliceP.Add(tc.sliceP)
		}
	}
}

// ImpactFlusher adds the counts of the rules versions this replica judged to
// their Redis hashes (redisx.RulesImpactKey), where the rollout controller
// reads the sum over all replicas: a rollout.Flusher of impactCounts. Safe
// for concurrent use.
type ImpactFlusher struct{ rollout.Flusher }

// NewImpactFlusher returns a flusher writing the counts of topic's versions to rdb.
func NewImpactFlusher(rdb redis.UniversalClient, topic string, log *slog.Logger) *ImpactFlusher {
	return &ImpactFlusher{rollout.Flusher{Redis: rdb, Topic: topic, Log: log}}
}

// track returns new counts for version v in phase (at step, -1 for none),
// flushed until retired.
func (f *ImpactFlusher) track(v int64, phase string, step int64) *impactCounts {
	c := &impactCounts{phase: phase}
	f.Track(v, step, c)
	return c
}

// retire stops tracking i after its next flush.
func (f *ImpactFlusher) retire(i limiter.Impact) {
	if c, ok := i.(*impactCounts); ok && c != nil {
		f.Retire(c)
	}
}

// versionName names a rules version's source in errors and logs.
func versionName(v int64) string { return "rules version " + strconv.FormatInt(v, 10) }
