// Package influxcounts writes the limiter's decisions per scope, and its
// Redis round trips, to InfluxDB: the adjuster's signals.
package influxcounts

import (
	"context"
	"log/slog"
	"sync"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// ScopeCounts aggregates decisions per scope (rule id) and tier in memory and
// writes one point per scope and interval to InfluxDB, measurement
// "limiter_decisions", tags gateway, scope and tier, integer fields allowed,
// blocked and shadow. No principal ids or IPs are written: tags stay
// low-cardinality (the rules file bounds the scopes) and analytics hold no
// personal data. Safe for concurrent use; Observe never blocks on InfluxDB.
type ScopeCounts struct {
	w       api.WriteAPI
	gateway string
	now     func() time.Time

	mu     sync.Mutex
	counts map[scopeKey]*scopeCount

	rtt    *limiter.RedisLatency // nil: no limiter_redis points
	budget time.Duration
}

type scopeKey struct {
	scope string
	tier  events.Tier
}

type scopeCount struct{ allowed, blocked, shadow int64 }

var _ server.Observer = (*ScopeCounts)(nil)

// NewScopeCounts writes through client's non-blocking write API to org/bucket
// ("db/rp" on InfluxDB 1.8), logging the failures the client reports asynchronously.
func NewScopeCounts(client influxdb2.Client, org, bucket, gateway string, now func() time.Time, log *slog.Logger) *ScopeCounts {
	w := client.WriteAPI(org, bucket)
	errs := w.Errors() // taken here: Close clears the field the method reads
	go func() {
		for err := range errs {
			log.Warn("influxdb write", "err", err)
		}
	}()
	return &ScopeCounts{w: w, gateway: gateway, now: now, counts: map[scopeKey]*scopeCount{}}
}

// TrackRedis makes every flush also write one "limiter_redis" point (tag
// gateway) from the round trips l collected since the last: integer field
// pipelines, float fields p50_ms, p99_ms, max_ms, and budget_used = p99 ÷
// budget, the adjuster's Redis-latency signal (docs/adjuster.md). Nothing is
// written for an interval without a pipeline. Call before Run.
func (s *ScopeCounts) TrackRedis(l *limiter.RedisLatency, budget time.Duration) {
	s.rtt, s.budget = l, budget
}

// Observe counts one decision; shadow counts a would-have-blocked decision of a shadow rule.
func (s *ScopeCounts) Observe(scope string, tier events.Tier, allowed, shadow bool) {
	k := scopeKey{scope, tier}
	s.mu.Lock()
	c := s.counts[k]
	if c == nil {
		c = &scopeCount{}
		s.counts[k] = c
	}
	switch {
	case shadow:
		c.shadow++
	case allowed:
		c.allowed++
	default:
		c.blocked++
	}
	s.mu.Unlock()
}

// Flush queues one point per scope seen since the last flush and asks the
// client to send them.
func (s *ScopeCounts) Flush() {
	s.mu.Lock()
	counts := s.counts
	s.counts = make(map[scopeKey]*scopeCount, len(counts))
	s.mu.Unlock()
	ts := s.now()
	for k, c := range counts {
		s.w.WritePoint(influxdb2.NewPoint("limiter_decisions",
			map[string]string{"gateway": s.gateway, "scope": k.scope, "tier": string(k.tier)},
			map[string]any{"allowed": c.allowed, "blocked": c.blocked, "shadow": c.shadow},
			ts))
	}
	if s.rtt != nil {
		if r := s.rtt.Take(); r.Pipelines > 0 {
			ms := func(d time.Duration) float64 { return float64(d) / float64(time.Millisecond) }
			s.w.WritePoint(influxdb2.NewPoint("limiter_redis", map[string]string{"gateway": s.gateway},
				map[string]any{"pipelines": r.Pipelines, "p50_ms": ms(r.P50), "p99_ms": ms(r.P99), "max_ms": ms(r.Max),
					"budget_used": float64(r.P99) / float64(s.budget)},
				ts))
		}
	}
	s.w.Flush()
}

// Run flushes every interval until ctx is done, then once more.
func (s *ScopeCounts) Run(ctx context.Context, every time.Duration) error {
	_ = tick.Every(ctx, every, func(context.Context) { s.Flush() })
	s.Flush()
	return nil
}
