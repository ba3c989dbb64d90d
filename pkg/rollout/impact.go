package rollout

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// Phases of a version's impact counts.
const (
	PhaseShadow   = "shadow"   // the candidate's verdicts beside the enforced rules
	PhaseEnforced = "enforced" // the version's own answers while in force
)

// Priorities, in the order pages show them (limiter.Priority's names).
var Priorities = []string{"critical", "degraded", "best_effort", "bulk"}

// Counts are the decisions one phase of one version judged, by priority.
type Counts struct {
	Total   map[string]int64 // by priority
	Blocked map[string]int64 // blocked (enforced) or would have blocked (shadow)
	Errors  int64            // shadow: candidate checks that could not be asked (Redis)
}

// Share is the blocked share of priority p's decisions (0 when none).
func (c Counts) Share(p string) float64 {
	if c.Total[p] == 0 {
		return 0
	}
	return float64(c.Blocked[p]) / float64(c.Total[p])
}

// Impact is what the limiter replicas counted for one version: since it
// began, and over the recent window (Window 0: not read).
type Impact struct {
	Version  int64
	Shadow   Counts
	Enforced Counts
	// Classes are the shadow's paired counts by full class: the candidate's
	// and its parent's verdicts on the same decisions (ImpactClassField).
	Classes map[FullClass]Paired

	// SliceClasses are the paired counts of the decisions the candidate
	// answered (a step's slice of principals), since it began.
	SliceClasses map[FullClass]Paired

	// Lost is, over every class, the decisions the parent penalized and,
	// of those, the ones the candidate did not, since it began (the
	// detector's parameters count it: Counter.AddPaired).
	Lost Lost

	Window                       time.Duration
	RecentShadow, RecentEnforced Counts
	RecentClasses                map[FullClass]Paired

	// Step is the step the step counts are of (0: not read): since it began,
	// all the decisions both versions judged (StepClasses, StepShadow) and
	// those the candidate answered (StepSlice).
	Step                   int64
	StepShadow             Counts
	StepClasses, StepSlice map[FullClass]Paired
}

// LostField starts the impact hash fields of Lost ("lost:parent",
// "lost:lost").
const LostField = "lost"

// Lost is what a candidate gives up of what its parent catches: the
// decisions the parent penalized (Parent) and those of them the candidate
// does not (Lost).
type Lost struct{ Parent, Lost int64 }

// Share is Lost over Parent (0 with none).
func (l Lost) Share() float64 {
	if l.Parent == 0 {
		return 0
	}
	return float64(l.Lost) / float64(l.Parent)
}

func newCounts() Counts { return Counts{Total: map[string]int64{}, Blocked: map[string]int64{}} }

// ReadImpact reads the counts of version v of topic since it began
// (redisx.RulesImpactKey).
func ReadImpact(ctx context.Context, rdb redis.UniversalClient, topic string, v int64) (Impact, error) {
	h, err := rdb.HGetAll(ctx, redisx.RulesImpactKey(topic, v)).Result()
	if err != nil {
		return Impact{}, fmt.Errorf("read impact of rules version %d: %w", v, err)
	}
	im := Impact{Version: v, Shadow: newCounts(), Enforced: newCounts(), Classes: map[FullClass]Paired{}, SliceClasses: map[FullClass]Paired{}}
	addFields(h, fieldSink{&im.Shadow, &im.Enforced, im.Classes, im.SliceClasses, &im.Lost})
	return im, nil
}

// ReadStep adds to im the counts of version im.Version since its step
// began (redisx.RulesImpactStepKey).
func ReadStep(ctx context.Context, rdb redis.UniversalClient, topic string, im *Impact, step int64) error {
	h, err := rdb.HGetAll(ctx, redisx.RulesImpactStepKey(topic, im.Version, step)).Result()
	if err != nil {
		return fmt.Errorf("read impact of rules version %d at step %d: %w", im.Version, step, err)
	}
	im.Step, im.StepShadow, im.StepClasses, im.StepSlice = step, newCounts(), map[FullClass]Paired{}, map[FullClass]Paired{}
	var enforced Counts = newCounts()
	addFields(h, fieldSink{&im.StepShadow, &enforced, im.StepClasses, im.StepSlice, nil})
	return nil
}

// ReadRecent adds to im the counts of version im.Version over the window
// ending at now: the sum of the time slots (redisx.RulesImpactSlotKey) the
// window covers, the slot holding now-window included (so up to one slot
// more than the window).
func ReadRecent(ctx context.Context, rdb redis.UniversalClient, topic string, im *Impact, window time.Duration, now time.Time) error {
	if window <= 0 || window > redisx.RulesImpactSlotTTL {
		return fmt.Errorf("recent window %s: must be in (0, %s]", window, redisx.RulesImpactSlotTTL)
	}
	pipe := rdb.Pipeline()
	var cmds []*redis.MapStringStringCmd
	start := now.Add(-window)
	slot := int64(redisx.RulesImpactSlot / time.Second)
	for t := time.Unix(start.Unix()-start.Unix()%slot, 0); !t.After(now); t = t.Add(redisx.RulesImpactSlot) {
		cmds = append(cmds, pipe.HGetAll(ctx, redisx.RulesImpactSlotKey(topic, im.Version, t)))
	}
	if _, err := pipe.Exec(ctx); err != nil {
		return fmt.Errorf("read recent impact of rules version %d: %w", im.Version, err)
	}
	im.Window, im.RecentShadow, im.RecentEnforced, im.RecentClasses = window, newCounts(), newCounts(), map[FullClass]Paired{}
	slice := map[FullClass]Paired{} // the recent window judges all the paired decisions
	for _, c := range cmds {
		addFields(c.Val(), fieldSink{&im.RecentShadow, &im.RecentEnforced, im.RecentClasses, slice, nil})
	}
	return nil
}

// fieldSink is where addFields puts an impact hash's fields.
type fieldSink struct {
	shadow, enforced *Counts
	classes, slice   map[FullClass]Paired
	lost             *Lost // nil: not read
}

// addFields adds an impact hash's fields ("shadow:critical:total", …) to the
// counts of their phase, its class fields to classes and its slice's class
// fields ("cls:slice-n|…") to slice.
func addFields(h map[string]string, sink fieldSink) {
	shadow, enforced := sink.shadow, sink.enforced
	for field, val := range h {
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			continue
		}
		if what, fc, ok := parseClassField(field); ok {
			m := sink.classes
			if w, ok := strings.CutPrefix(what, SlicePrefix); ok {
				m, what = sink.slice, w
			}
			p := m[fc]
			switch what {
			case "n":
				p.N += n
			case "cand":
				p.Cand += n
			case "parent":
				p.Parent += n
			}
			m[fc] = p
			continue
		}
		parts := strings.Split(field, ":")
		if parts[0] == LostField && len(parts) == 2 {
			if sink.lost != nil && parts[1] == "parent" {
				sink.lost.Parent += n
			} else if sink.lost != nil && parts[1] == "lost" {
				sink.lost.Lost += n
			}
			continue
		}
		var c *Counts
		switch parts[0] {
		case PhaseShadow:
			c = shadow
		case PhaseEnforced:
			c = enforced
		default:
			continue
		}
		switch {
		case len(parts) == 2 && parts[1] == "errors":
			c.Errors += n
		case len(parts) == 3 && parts[2] == "total":
			c.Total[parts[1]] += n
		case len(parts) == 3 && parts[2] == "blocked":
			c.Blocked[parts[1]] += n
		}
	}
}
