package tick

import "time"

// Throttle lets one event through per interval and counts the events it holds
// back meanwhile: a log line of one cause at most once an interval, saying
// how many more there were. The zero value lets the first event through. It
// is not safe for concurrent use: its users hold their own lock.
type Throttle struct {
	last time.Time
	held int64
}

// Pass reports whether the event at now goes through — none went through in
// the interval before it — and, when it does, how many were held back since
// the last one that went through.
func (e *Throttle) Pass(now time.Time, interval time.Duration) (bool, int64) {
	if !e.last.IsZero() && now.Sub(e.last) < interval {
		e.held++
		return false, 0
	}
	held := e.held
	e.last, e.held = now, 0
	return true, held
}
