package events

import "fmt"

// CostBoundError refuses a decision whose cost is over what a consumer
// accepts (FLOODGATE_EVENT_MAX_COST, default DefaultMaxCost): whoever could
// write one event with cost 1,000,000 would otherwise quota-lock a victim for
// hours (issue 22 S3). It is permanent: the consumer dead-letters the event
// with this reason and counts nothing of it.
type CostBoundError struct{ Cost, Max int64 }

func (e *CostBoundError) Error() string {
	return fmt.Sprintf("cost %d is over the %d an event may carry (FLOODGATE_EVENT_MAX_COST); nothing of it was counted", e.Cost, e.Max)
}

// Permanent marks the error permanent (pkg/stream dead-letters it at once).
func (e *CostBoundError) Permanent() bool { return true }

// CheckCost returns a *CostBoundError when cost is over max.
func CheckCost(cost, max int64) error {
	if cost > max {
		return &CostBoundError{Cost: cost, Max: max}
	}
	return nil
}
