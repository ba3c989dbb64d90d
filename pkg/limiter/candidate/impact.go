package candidate

import (
	"context"
	"log/slog"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// impactCounts are one rules version's decisions in one phase, by priority,
// counted on the hot path (two atomic adds) and flushed to Redis by an
// ImpactFlusher.
type impactCounts struct {
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

var _ limiter.Impact = (*impactCounts)(nil)

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

// ImpactFlusher adds the counts of the rules versions this replica judged to
// their Redis hashes (redisx.RulesImpactKey), where the rollout controller
// reads the sum over all replicas. Safe for concurrent use.
type ImpactFlusher struct {
	rdb   redis.UniversalClient
	topic string
	log   *slog.Logger
	now   func() time.Time // the flush's time slot (redisx.RulesImpactSlotKey)

	mu      sync.Mutex
	entries []impactEntry
}

type impactEntry struct {
	version int64
	phase   string // rollout.PhaseShadow or rollout.PhaseEnforced
	// step is a candidate's step (0: its shadow period), whose own hash
	// (redisx.RulesImpactStepKey) gets its counts too; -1: none (enforced).
	step    int64
	counts  *impactCounts
	retired bool
}

// impactTTL keeps a version's counts a month after its last decision.
const impactTTL = 30 * 24 * time.Hour

// NewImpactFlusher returns a flusher writing the counts of topic's versions to rdb.
func NewImpactFlusher(rdb redis.UniversalClient, topic string, log *slog.Logger) *ImpactFlusher {
	return &ImpactFlusher{rdb: rdb, topic: topic, log: log, now: time.Now}
}

// track returns new counts for version v in phase (at step, -1 for none),
// flushed until retired.
func (f *ImpactFlusher) track(v int64, phase string, step int64) *impactCounts {
	c := &impactCounts{}
	f.mu.Lock()
	f.entries = append(f.entries, impactEntry{version: v, phase: phase, step: step, counts: c})
	f.mu.Unlock()
	return c
}

// retire stops tracking c after its next flush.
func (f *ImpactFlusher) retire(i limiter.Impact) {
	c, ok := i.(*impactCounts)
	if !ok || c == nil {
		return
	}
	f.mu.Lock()
	for i := range f.entries {
		if f.entries[i].counts == c {
			f.entries[i].retired = true
		}
	}
	f.mu.Unlock()
}

// Run flushes every interval until ctx is done, then once more.
func (f *ImpactFlusher) Run(ctx context.Context, every time.Duration) error {
	_ = tick.Every(ctx, every, func(ctx context.Context) {
		if err := f.Flush(ctx); err != nil && ctx.Err() == nil {
			f.log.Warn("flush rules impact counts; kept for the next flush", "err", err)
		}
	})
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = f.Flush(fctx)
	return nil
}

// Flush adds what was counted since the last flush to Redis. Counts a
// failed flush took are put back.
func (f *ImpactFlusher) Flush(ctx context.Context) error {
	f.mu.Lock()
	entries := append([]impactEntry(nil), f.entries...)
	kept := f.entries[:0]
	for _, en := range f.entries {
		if !en.retired {
			kept = append(kept, en)
		}
	}
	f.entries = kept
	f.mu.Unlock()

	type takenClass struct {
		pc                     *pairedCounts
		n, cand, parent        int64
		sliceN, sliceC, sliceP int64
	}
	type taken struct {
		c              *impactCounts
		total, blocked [admission.PriorityBulk + 1]int64
		errors         int64
		classes        []takenClass
	}
	var took []taken
	pipe := f.rdb.Pipeline()
	now := f.now()
	for _, en := range entries {
		tk := taken{c: en.counts}
		// The version's counts since it began, and the same counts in this
		// flush's time slot (the controller's recent window).
		// At a step (or in the shadow period), the counts since it began too.
		key, slot := redisx.RulesImpactKey(f.topic, en.version), redisx.RulesImpactSlotKey(f.topic, en.version, now)
		step := ""
		if en.step >= 0 {
			step = redisx.RulesImpactStepKey(f.topic, en.version, en.step)
		}
		incr := func(field string, n int64) {
			pipe.HIncrBy(ctx, key, field, n)
			pipe.HIncrBy(ctx, slot, field, n)
			if step != "" {
				pipe.HIncrBy(ctx, step, field, n)
			}
		}
		wrote := false
		for p := admission.PriorityCritical; p <= admission.PriorityBulk; p++ {
			tk.total[p], tk.blocked[p] = en.counts.total[p].Swap(0), en.counts.blocked[p].Swap(0)
			if tk.total[p] > 0 {
				incr(en.phase+":"+p.String()+":total", tk.total[p])
				wrote = true
			}
			if tk.blocked[p] > 0 {
				incr(en.phase+":"+p.String()+":blocked", tk.blocked[p])
			}
		}
		if tk.errors = en.counts.errors.Swap(0); tk.errors > 0 {
			incr(en.phase+":errors", tk.errors)
			wrote = true
		}
		en.counts.classMu.RLock()
		for fc, pc := range en.counts.classes {
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
					incr(rollout.ImpactClassField(f.what, fc), f.n)
				}
			}
			tk.classes = append(tk.classes, tc)
			wrote = true
		}
		en.counts.classMu.RUnlock()
		if wrote {
			pipe.Expire(ctx, key, impactTTL)
			pipe.Expire(ctx, slot, redisx.RulesImpactSlotTTL)
			if step != "" {
				pipe.Expire(ctx, step, impactTTL)
			}
			took = append(took, tk)
		}
	}
	if len(took) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		for _, tk := range took {
			for p := admission.PriorityCritical; p <= admission.PriorityBulk; p++ {
				tk.c.total[p].Add(tk.total[p])
				tk.c.blocked[p].Add(tk.blocked[p])
			}
			tk.c.errors.Add(tk.errors)
			for _, tc := range tk.classes {
				tc.pc.n.Add(tc.n)
				tc.pc.cand.Add(tc.cand)
				tc.pc.parent.Add(tc.parent)
				tc.pc.sliceN.Add(tc.sliceN)
				tc.pc.sliceC.Add(tc.sliceC)
				tc.pc.sliceP.Add(tc.sliceP)
			}
		}
		return err
	}
	return nil
}

// versionName names a rules version's source in errors and logs.
func versionName(v int64) string { return "rules version " + strconv.FormatInt(v, 10) }
