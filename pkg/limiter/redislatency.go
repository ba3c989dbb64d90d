package limiter

import (
	"sync"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// RedisLatency collects the round trips of the limiter's Redis pipelines
// (one per batch of checks, not one per check) between two reads, for the
// adjuster's Redis-latency signal: a Redis that answers ever slower is a
// reason to shed low priorities before its budget is spent. Safe for
// concurrent use; recording costs one mutex and one histogram increment.
type RedisLatency struct {
	mu sync.Mutex
	h  *hdrhistogram.Histogram // microseconds
}

// NewRedisLatency returns an empty recorder for round trips of 1 µs to 60 s.
func NewRedisLatency() *RedisLatency {
	return &RedisLatency{h: hdrhistogram.New(1, 60_000_000, 2)}
}

// Record adds one round trip.
func (l *RedisLatency) Record(d time.Duration) {
	us := max(d.Microseconds(), 1)
	l.mu.Lock()
	_ = l.h.RecordValue(us) // beyond 60 s: dropped, the budget ends far sooner
	l.mu.Unlock()
}

// RedisLatencySnapshot is what a read returns.
type RedisLatencySnapshot struct {
	Pipelines int64
	P50, P99  time.Duration
	Max       time.Duration
}

// Take returns the round trips recorded since the last Take and starts over.
func (l *RedisLatency) Take() RedisLatencySnapshot {
	l.mu.Lock()
	defer l.mu.Unlock()
	s := RedisLatencySnapshot{Pipelines: l.h.TotalCount()}
	if s.Pipelines > 0 {
		s.P50 = time.Duration(l.h.ValueAtQuantile(50)) * time.Microsecond
		s.P99 = time.Duration(l.h.ValueAtQuantile(99)) * time.Microsecond
		s.Max = time.Duration(l.h.Max()) * time.Microsecond
	}
	l.h.Reset()
	return s
}
