package admission

import (
	"fmt"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Priority is a request's priority bucket. Under congestion the adjuster
// raises the shed level and the limiter refuses the lower buckets before they
// reach Redis, even when they are under their own limits, keeping capacity
// for CRITICAL: level 1 sheds BULK, level 2 also BEST_EFFORT, level 3 also
// DEGRADED. CRITICAL is never shed.
type Priority uint8

// Priorities, highest first. PriorityUnset takes the route's default from the
// rules file (priorities:, then defaults.priority), else DefaultPriority.
const (
	PriorityUnset Priority = iota
	PriorityCritical
	PriorityDegraded
	PriorityBestEffort
	PriorityBulk
)

// DefaultPriority is the priority of a request that names none on a route the
// rules give none: the second bucket, so traffic nobody classified is shed only
// at the last level, after everything declared less important.
const DefaultPriority = PriorityDegraded

// priorityNames are the wire names (decision.v1's priority), indexed by Priority.
var priorityNames = [...]events.Priority{"", events.PriorityCritical, events.PriorityDegraded, events.PriorityBestEffort, events.PriorityBulk}

// PriorityNames lists the accepted names, highest first.
const PriorityNames = "critical|degraded|best_effort|bulk"

// ParsePriority reads a wire name; "" is PriorityUnset.
func ParsePriority(s string) (Priority, error) {
	for i, n := range priorityNames {
		if s == string(n) {
			return Priority(i), nil
		}
	}
	return PriorityUnset, fmt.Errorf("%q: want one of %s", s, PriorityNames)
}

// Event is the priority as decision.v1 carries it ("" for PriorityUnset).
func (p Priority) Event() events.Priority {
	if int(p) < len(priorityNames) {
		return priorityNames[p]
	}
	return ""
}

func (p Priority) String() string {
	if int(p) < len(priorityNames) {
		return string(priorityNames[p])
	}
	return "priority(" + strconv.Itoa(int(p)) + ")"
}

// MaxShedLevel is the highest shed level: everything but CRITICAL is shed.
const MaxShedLevel = 3

// Utilization statuses, as answers carry them (cluster_utilization_status).
const (
	StatusNormal   = "NORMAL"        // level 0: nothing is shed
	StatusDegraded = "DEGRADED_MODE" // levels 1–2: BULK (and BEST_EFFORT) shed
	StatusCritical = "CRITICAL_ONLY" // level 3: only CRITICAL is served
)

// Shedding is the adjuster's shed state as the limiter applies it.
type Shedding struct {
	Level      int           // 0..MaxShedLevel
	RetryAfter time.Duration // what a shed answer tells the client
	Reason     string        // why, for logs and the console
}

// Sheds reports whether a request of priority p is refused at this level.
func (s Shedding) Sheds(p Priority) bool {
	return s.Level > 0 && p != PriorityCritical && int(p) > int(PriorityBulk)-s.Level
}

// Status is the utilization status of the level.
func (s Shedding) Status() string {
	switch {
	case s.Level <= 0:
		return StatusNormal
	case s.Level >= MaxShedLevel:
		return StatusCritical
	}
	return StatusDegraded
}

// Fields of the shed hash (redisx.ShedKey) the adjuster writes and every
// limiter polls with the scales. The adjuster refreshes the hash every tick
// and gives it a time to live of a few ticks, so a dead adjuster cannot leave
// the fleet shedding: a missing hash is level 0.
const (
	ShedFieldLevel      = "level"
	ShedFieldRetryAfter = "retry_after_ms"
	ShedFieldReason     = "reason"
)

// defaultShedRetry is a shed answer's Retry-After when the hash names none.
const defaultShedRetry = 5 * time.Second

// ParseShedding reads the shed hash; an empty hash is level 0.
func ParseShedding(h map[string]string) (Shedding, error) {
	s := Shedding{RetryAfter: defaultShedRetry, Reason: h[ShedFieldReason]}
	if v, ok := h[ShedFieldLevel]; ok {
		n, err := strconv.Atoi(v)
		if err != nil || n < 0 || n > MaxShedLevel {
			return Shedding{}, fmt.Errorf("%s %q: want 0..%d", ShedFieldLevel, v, MaxShedLevel)
		}
		s.Level = n
	}
	if v, ok := h[ShedFieldRetryAfter]; ok {
		ms, err := strconv.ParseInt(v, 10, 64)
		if err != nil || ms < 1 || ms > int64(time.Hour/time.Millisecond) {
			return Shedding{}, fmt.Errorf("%s %q: want 1..3600000", ShedFieldRetryAfter, v)
		}
		s.RetryAfter = time.Duration(ms) * time.Millisecond
	}
	return s, nil
}
