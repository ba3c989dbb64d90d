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

// Counter counts the decisions one version of a topic judged, in the
// fields ReadImpact reads (phase:priority:total|blocked, and the paired
// class fields ImpactClassField), and adds them to the version's hashes on
// Flush. The limiter replicas count rules versions on their hot path with
// their own lock-free counts (pkg/limiter/candidate); Counter is the same
// contract for readers that count at a lower rate (the detector's
// parameters). Safe for concurrent use.
type Counter struct {
	Version int64
	Phase   string // PhaseShadow or PhaseEnforced
	Step    int64  // a candidate's step (0: its shadow period); -1: none

	mu     sync.Mutex
	fields map[string]int64
}

// NewCounter returns counts of version v in phase at step (-1: none).
func NewCounter(v int64, phase string, step int64) *Counter {
	return &Counter{Version: v, Phase: phase, Step: step, fields: map[string]int64{}}
}

// maxCounterFields bounds one flush's fields: classes past it count under
// route "other".
const maxCounterFields = 4 * 512

// Add counts one decision of priority: blocked (enforced) or would have
// blocked (shadow).
func (c *Counter) Add(priority string, blocked bool) {
	c.mu.Lock()
	c.fields[c.Phase+":"+priority+":total"]++
	if blocked {
		c.fields[c.Phase+":"+priority+":blocked"]++
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

// take empties the counts and returns them.
func (c *Counter) take() map[string]int64 {
	c.mu.Lock()
	defer c.mu.Unlock()
	f := c.fields
	c.fields = map[string]int64{}
	return f
}

// giveBack puts counts a failed flush took back.
func (c *Counter) giveBack(f map[string]int64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for k, n := range f {
		c.fields[k] += n
	}
}

// CounterTTL keeps a version's counts a month after its last decision.
const CounterTTL = 30 * 24 * time.Hour

// Flusher adds Counters to their versions' hashes on a topic
// (redisx.RulesImpactKey, its time slot and its step's hash), where the
// controller reads the sum over every counting process. Safe for
// concurrent use.
type Flusher struct {
	Redis redis.UniversalClient
	Topic string
	Log   *slog.Logger
	Now   func() time.Time

	mu       sync.Mutex
	counters []*Counter
}

// Track flushes c from now on; the returned func stops it after the next
// flush.
func (f *Flusher) Track(c *Counter) (untrack func()) {
	f.mu.Lock()
	f.counters = append(f.counters, c)
	f.mu.Unlock()
	return func() {
		_ = f.Flush(context.Background())
		f.mu.Lock()
		defer f.mu.Unlock()
		for i, x := range f.counters {
			if x == c {
				f.counters = append(f.counters[:i], f.counters[i+1:]...)
				return
			}
		}
	}
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

// Flush adds what was counted since the last flush; a failed flush puts its
// counts back.
func (f *Flusher) Flush(ctx context.Context) error {
	f.mu.Lock()
	cs := append([]*Counter(nil), f.counters...)
	f.mu.Unlock()
	now := time.Now
	if f.Now != nil {
		now = f.Now
	}
	type taken struct {
		c *Counter
		f map[string]int64
	}
	var took []taken
	pipe := f.Redis.Pipeline()
	for _, c := range cs {
		fields := c.take()
		if len(fields) == 0 {
			continue
		}
		took = append(took, taken{c, fields})
		keys := []string{redisx.RulesImpactKey(f.Topic, c.Version), redisx.RulesImpactSlotKey(f.Topic, c.Version, now())}
		if c.Step >= 0 {
			keys = append(keys, redisx.RulesImpactStepKey(f.Topic, c.Version, c.Step))
		}
		for _, k := range keys {
			for field, n := range fields {
				pipe.HIncrBy(ctx, k, field, n)
			}
		}
		pipe.Expire(ctx, keys[0], CounterTTL)
		pipe.Expire(ctx, keys[1], redisx.RulesImpactSlotTTL)
		if len(keys) > 2 {
			pipe.Expire(ctx, keys[2], CounterTTL)
		}
	}
	if len(took) == 0 {
		return nil
	}
	if _, err := pipe.Exec(ctx); err != nil {
		for _, t := range took {
			t.c.giveBack(t.f)
		}
		return err
	}
	return nil
}
