package events

import (
	"fmt"
	"strconv"
	"strings"
)

// DefaultDayQuotas are the daily quotas of the limiter's built-in rules
// (rate-limits.yaml: bots 86,400 units a day), the default of
// FLOODGATE_EVENT_DAY_QUOTAS.
const DefaultDayQuotas = "bot=86400"

// DefaultDaySlackPercent is the default of FLOODGATE_EVENT_DAY_SLACK.
const DefaultDaySlackPercent = 10

// DayBounds are what the stream's consumers let one principal be charged per
// UTC day: for each kind with a daily quota, the largest quota of any plan of
// that kind plus a slack (a percentage of it) for what an honest limiter may
// admit past its quota — units admitted between a lost Redis day counter and
// its re-seed, or under a fail-open policy. The decision event does not say
// the principal's plan, so the bound of a kind is that of its largest plan.
// A kind without a quota has no bound. The zero value bounds nothing.
type DayBounds struct {
	bounds map[PrincipalKind]int64
}

// ParseDayBounds reads FLOODGATE_EVENT_DAY_QUOTAS ("kind=units,…", e.g.
// "bot=86400,api_key=1000000"; "" or "none" for no bound) with
// FLOODGATE_EVENT_DAY_SLACK, slackPercent in 0..100.
func ParseDayBounds(spec string, slackPercent int) (DayBounds, error) {
	if slackPercent < 0 || slackPercent > 100 {
		return DayBounds{}, fmt.Errorf("slack %d%%: want 0..100", slackPercent)
	}
	spec = strings.TrimSpace(spec)
	if spec == "" || spec == "none" {
		return DayBounds{}, nil
	}
	b := DayBounds{bounds: map[PrincipalKind]int64{}}
	for _, entry := range strings.Split(spec, ",") {
		k, v, ok := strings.Cut(strings.TrimSpace(entry), "=")
		kind := PrincipalKind(k)
		if !ok || !kind.Valid() {
			return DayBounds{}, fmt.Errorf("%q: want kind=units with kind one of user|bot|api_key|anonymous", entry)
		}
		if _, dup := b.bounds[kind]; dup {
			return DayBounds{}, fmt.Errorf("%q: kind %s appears twice", entry, kind)
		}
		q, err := strconv.ParseInt(v, 10, 64)
		if err != nil || q < 1 || q > 1<<40 {
			return DayBounds{}, fmt.Errorf("%q: units must be an integer in 1..%d", entry, int64(1)<<40)
		}
		b.bounds[kind] = q + q*int64(slackPercent)/100
	}
	return b, nil
}

// Bound is what one principal of kind may be charged per day, and whether
// there is a bound at all.
func (b DayBounds) Bound(kind PrincipalKind) (int64, bool) {
	v, ok := b.bounds[kind]
	return v, ok
}

// DayBoundError refuses a decision that would charge its principal past the
// day's bound: no honest limiter admits that much (issue 37: nine events at
// the cost cap took a bot past its daily quota). It is permanent: the
// consumer dead-letters the event with this reason and counts nothing of it.
type DayBoundError struct {
	Principal, Day string
	Charged        int64 // units of the principal-day counted before this event
	Cost, Bound    int64
}

func (e *DayBoundError) Error() string {
	return fmt.Sprintf("cost %d would take %s to %d units on %s, over the %d a principal of its kind may be charged in a day "+
		"(FLOODGATE_EVENT_DAY_QUOTAS plus FLOODGATE_EVENT_DAY_SLACK); nothing of it was counted",
		e.Cost, e.Principal, e.Charged+e.Cost, e.Day, e.Bound)
}

// Permanent marks the error permanent (pkg/stream dead-letters it at once).
func (e *DayBoundError) Permanent() bool { return true }
