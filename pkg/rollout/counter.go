package rollout

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// PrincipalSlice places principal p in the principal-hash space of gradual
// rollouts: [0, BasisPoints), from FNV-1a (64-bit) of its key ("kind:id").
// Every reader of a topic — limiter replicas for rules, detector instances
// for detector parameters — places a principal the same, and a step's slice
// holds the slices of the steps before it (a principal once in stays in).
func PrincipalSlice(p events.Principal) int64 {
	const offset, prime = 14695981039346656037, 1099511628211
	h := uint64(offset)
	for _, s := range [...]string{string(p.Kind), ":", p.ID} {
		for i := 0; i < len(s); i++ {
			h ^= uint64(s[i])
			h *= prime
		}
	}
	return int64(h % BasisPoints)
}

// A Tally is the counts of one version in one phase that a Flusher adds to
// the version's hashes: the limiter replicas' lock-free counts of rules
// versions on their hot path (pkg/limiter/candidate), and Counter for
// readers that count at a lower rate (the detector's parameters). Safe for
// concurrent use.
type Tally interface {
	// Take passes add every field counted since the last Take (the fields
	// ReadImpact reads, n > 0) and returns what adds them back after a
	// failed flush.
	Take(add func(field string, n int64)) (giveBack func())
}

// CountField is the impact hash field of a phase's decisions of a priority:
// "<phase>:<priority>:total", or ":blocked" for those blocked (would have
// blocked, in shadow).
func CountField(phase, priority string, blocked bool) string {
	if blocked {
		return phase + ":" + priority + ":blocked"
	}
	return phase + ":" + priority + ":total"
}

// ErrorsField is the impact hash field of a phase's checks that could not be
// judged: "<phase>:errors".
func ErrorsField(phase string) string { return phase + ":errors" }

// Counter is a Tally of the fields ReadImpact reads (phase:priority:total|blocked,
// and the paired class fields ImpactClassField) under one lock.
type Counter struct {
	Phase string // PhaseShadow or PhaseEnforced

	mu     sync.Mutex
	fields map[string]int64
}

var _ Tally = (*Counter)(nil)

// NewCounter returns counts of a version in phase.
func NewCounter(phase string) *Counter {
	return &Counter{Phase: phase, fields: map[string]int64{}}
}

// maxCounterFields bounds one flush's fields: classes past it count under
// route "other".
const maxCounterFields = 4 * 512

// Add counts one decision of priority: blocked (enforced) or would have
// blocked (shadow).
func (c *Counter) Add(priority string, blocked bool) {
	c.mu.Lock()
	c.fields[CountField(c.Phase, priority, false)]++
	if blocked {
		c.fields[CountField(c.Phase, priority, true)]++
	}
	c.mu.Unlock()
}

// AddPaired counts a decision both versions judged, by its full class: cand
// and parent are each version's verdict, and answered says the candidate's
// verdict was the answer (its step's slice).
func (c *Counter) AddPaired(fc FullClass, cand, parent, answered bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if len(c.fields) >= maxCounterFields {
		if _, ok := c.fields[ImpactClassField("n", fc)]; !ok {
			fc.Route = "other"
		}
	}
	add := func(what string, yes bool) {
		if yes {
			c.fields[ImpactClassField(what, fc)]++
		}
	}
	add("n", true)
	add("cand", cand)
	add("parent", parent)
	if parent {
		// Lost: what the enforced version penalizes and the candidate
		// does not (Impact.Lost), over every class.
		c.fields[LostField+":parent"]++
		if !cand {
			c.fields[LostField+":lost"]++
		}
	}
	add(SlicePrefix+"n", answered)
	add(SlicePrefix+"cand", answered && cand)
	add(SlicePrefix+"parent", answered && parent)
}

// Take empties the counts, passing each to add.
func (c *Counter) Take(add func(field string, n int64)) (giveBack func()) {
	c.mu.Lock()
	f := c.fields
	c.fields = map[string]int64{}
	c.mu.Unlock()
	for k, n := range f {
		add(k, n)
	}
	return func() {
		c.mu.Lock()
		defer c.mu.Unlock()
		for k, n := range f {
			c.fields[k] += n
		}
	}
}

// ImpactTTL keeps a version's counts a month after its last decision.
const ImpactTTL = 30 * 24 * time.Hour

// Flusher adds the Tallies of a topic's versions to their hashes
// (redisx.RulesImpactKey, its time slot and its step's hash), where the
// controller reads the sum over every counting process. Safe for
// concurrent use.
type Flusher struct {
	Redis redis.UniversalClient
	Topic string
	Log   *slog.Logger     // nil: failed flushes are not logged
	Now   func() time.Time // the flush's time slot (redisx.RulesImpactSlotKey); nil: time.Now

	mu      sync.Mutex
	entries []flushEntry
}

type flushEntry struct {
	version int64
	// step is a candidate's step (0: its shadow period), whose own hash
	// (redisx.RulesImpactStepKey) gets its counts too; -1: none (enforced).
	step    int64
	tally   Tally
	retired bool
}

// Track flushes t, the counts of version v (at step, -1 for none), until
// retired.
func (f *Flusher) Track(v, step int64, t Tally) {
	f.mu.Lock()
	f.entries = append(f.entries, flushEntry{version: v, step: step, tally: t})
	f.mu.Unlock()
}

// Retire stops tracking t after its next flush.
func (f *Flusher) Retire(t Tally) {
	f.mu.Lock()
	for i := range f.entries {
		if f.entries[i].tally == t {
			f.entries[i].retired = true
		}
	}
	f.mu.Unlock()
}

// Run flushes every interval until ctx is done, then once more.
func (f *Flusher) Run(ctx context.Context, every time.Duration) error {
	_ = tick.Every(ctx, every, func(ctx context.Context) {
		if err := f.Flush(ctx); err != nil && ctx.Err() == nil && f.Log != nil {
			f.Log.Warn("flush rollout impact counts; kept for the next flush", "topic", f.Topic, "err", err)
		}
	})
	fctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 2*time.Second)
	defer cancel()
	_ = f.Flush(fctx)
	return nil
}

// Flush adds what was counted since the last flush to Redis. Counts a
// failed flush took are put back.
func (f *Flusher) Flush(ctx context.Context) error {
	f.mu.Lock()
	entries := append([]flushEntry(nil), f.entries...)
	kept := f.entries[:0]
	for _, en := range f.entries {
		if !en.retired {
			kept = append(kept, en)
		}
	}
	f.entries = kept
	f.mu.Unlock()

	now := time.Now()
	if f.Now != nil {
		now = f.Now()
	}
	var giveBack []func()
	pipe := f.Redis.Pipeline()
	for _, en := range entries {
		// The version's counts since it began, and the same counts in this
		// flush's time slot (the controller's recent window).
		// At a step (or in the shadow period), the counts since it began too.
		key, slot := redisx.RulesImpactKey(f.Topic, en.version), redisx.RulesImpactSlotKey(f.Topic, en.version, now)
		step := ""
		if en.step >= 0 {
			step = redisx.RulesImpactStepKey(f.Topic, en.version, en.step)
		}
		wrote := false
		back := en.tally.Take(func(field string, n int64) {
			pipe.HIncrBy(ctx, key, field, n)
			pipe.HIncrBy(ctx, slot, field, n)
			if step != "" {
				pipe.HIncrBy(ctx, step, field, n)
			}
			wrote = true
		})
		if wrote {
			pipe.Expire(ctx, key, ImpactTTL)
			pipe.Expire(ctx, slot, redisx.RulesImpactSlotTTL)
			if step != "" {
				pipe.Expire(ctx, step, ImpactTTL)
			}
			giveBack = append(giveBack, back)
		}
	}
	if len(giveBack) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		for _, back := range giveBack {
			back()
		}
		return err
	}
	return nil
}
