package rollout

import (
	"context"
	"fmt"
	"strconv"
	"strings"

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

// Impact is what the limiter replicas counted for one version.
type Impact struct {
	Version  int64
	Shadow   Counts
	Enforced Counts
}

// ReadImpact reads the counts of version v of topic (redisx.RulesImpactKey).
func ReadImpact(ctx context.Context, rdb redis.UniversalClient, topic string, v int64) (Impact, error) {
	h, err := rdb.HGetAll(ctx, redisx.RulesImpactKey(topic, v)).Result()
	if err != nil {
		return Impact{}, fmt.Errorf("read impact of rules version %d: %w", v, err)
	}
	im := Impact{Version: v,
		Shadow:   Counts{Total: map[string]int64{}, Blocked: map[string]int64{}},
		Enforced: Counts{Total: map[string]int64{}, Blocked: map[string]int64{}}}
	for field, val := range h {
		n, err := strconv.ParseInt(val, 10, 64)
		if err != nil {
			continue
		}
		parts := strings.Split(field, ":")
		var c *Counts
		switch parts[0] {
		case PhaseShadow:
			c = &im.Shadow
		case PhaseEnforced:
			c = &im.Enforced
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
	return im, nil
}
