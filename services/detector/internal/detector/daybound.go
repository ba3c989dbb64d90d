package detector

import (
	"sync"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/metric"
)

// DayBound refuses, at the door, a decision that would take its principal's
// allowed units for the day past events.DayBounds (its kind's largest daily
// quota plus the slack): no honest limiter admits that much, so such events
// are forged or replayed and are dead-lettered, never scored (issue 37: nine
// events at the cost cap took a bot past its quota). It counts what it has
// seen since the detector's state was last rebuilt (a restart rewinds one
// scoring window), so it can let through more than the quota ledger would,
// never refuse less. State: one counter per principal of a bounded kind
// (bots, by default) for the current and the previous UTC day. Safe for
// concurrent use.
type DayBound struct {
	bounds  events.DayBounds
	refused prometheus.Counter

	mu     sync.Mutex
	newest string                      // the latest day seen (DayLayout)
	days   map[string]map[string]int64 // day → principal key → allowed units
}

// DayLayout is how DayBound names a UTC day (the quota ledger's layout).
const DayLayout = "2006-01-02"

// NewDayBound returns a DayBound on bounds; its counter
// (floodgate_detector_over_day_bound_total) is registered on reg.
func NewDayBound(bounds events.DayBounds, reg prometheus.Registerer) *DayBound {
	return &DayBound{bounds: bounds, days: map[string]map[string]int64{},
		refused: metric.With(reg).Counter("floodgate_detector_over_day_bound_total",
			"Decisions dead-lettered, never scored, because they would charge their principal past its daily bound (FLOODGATE_EVENT_DAY_QUOTAS plus FLOODGATE_EVENT_DAY_SLACK).")}
}

// SetDayBound makes Handle refuse decisions over b (nil: no daily bound).
// Call it before the detector handles its first message.
func (d *Detector) SetDayBound(b *DayBound) { d.day = b }

// Admit checks ev at the door: its cost against maxCost, then its allowed
// units against its principal's day. It returns a permanent error (the event
// is dead-lettered with the reason) and counts nothing of a refused event. A
// nil DayBound checks the cost only.
func (b *DayBound) Admit(ev *events.Decision, maxCost int64) error {
	if err := events.CheckCost(ev.Cost, maxCost); err != nil {
		return err
	}
	if b == nil || !ev.Allowed {
		return nil
	}
	bound, ok := b.bounds.Bound(ev.Principal.Kind)
	if !ok {
		return nil
	}
	day := ev.TS.UTC().Format(DayLayout)
	key := ev.Principal.Key()
	b.mu.Lock()
	defer b.mu.Unlock()
	if day > b.newest {
		b.newest = day
		for d := range b.days { // keep today and yesterday (late events)
			if d < ev.TS.UTC().AddDate(0, 0, -1).Format(DayLayout) {
				delete(b.days, d)
			}
		}
	}
	m := b.days[day]
	if m == nil {
		m = map[string]int64{}
		b.days[day] = m
	}
	if charged := m[key]; charged+ev.Cost > bound {
		b.refused.Inc()
		return &events.DayBoundError{Principal: key, Day: day, Charged: charged, Cost: ev.Cost, Bound: bound}
	}
	m[key] += ev.Cost
	return nil
}
