package worker

import (
	"maps"
	"slices"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Metrics are the worker's, per route ("METHOD route").
type Metrics struct {
	replayed, dead, expired, cancelled, sends, retries *prometheus.CounterVec
	age                                                *prometheus.HistogramVec
	Depth                                              *prometheus.GaugeVec

	mu     sync.Mutex
	routes map[string]*routeMetrics
}

type routeMetrics struct {
	replayed, dead, expired, cancelled, sends, retries prometheus.Counter
	age                                                prometheus.Observer
}

// NewMetrics registers the worker's metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := promauto.With(reg)
	c := func(name, help string) *prometheus.CounterVec {
		return f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_deferred_" + name, Help: help}, []string{"route"})
	}
	return &Metrics{
		replayed:  c("replayed_total", "Deferred requests the upstream accepted (1xx-3xx), by route."),
		dead:      c("dead_lettered_total", "Deferred requests the upstream refused (4xx), dead-lettered, by route."),
		expired:   c("expired_total", "Deferred requests past their max_age, never sent (or not answered), dead-lettered, by route."),
		cancelled: c("cancelled_total", "Deferred requests the edge cancelled (the client got a 429) found on the topic, by route."),
		sends:     c("sends_total", "Replays sent to the upstream (retries included), by route."),
		retries:   c("retries_total", "Replays retried after a 5xx, 408, 429 or a timeout, by route."),
		age: f.NewHistogramVec(prometheus.HistogramOpts{Name: "floodgate_deferred_age_seconds",
			Help:    "How long a deferred request waited, from its deferral to its first send, by route.",
			Buckets: []float64{0.1, 0.5, 1, 2, 5, 10, 30, 60, 120, 300, 600, 1800, 3600}}, []string{"route"}),
		Depth: f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_deferred_queued",
			Help: "Deferred requests waiting (unexpired), by route; polled from Redis."}, []string{"route"}),
		routes: map[string]*routeMetrics{},
	}
}

func (m *Metrics) route(r string) *routeMetrics {
	m.mu.Lock()
	defer m.mu.Unlock()
	if rm, ok := m.routes[r]; ok {
		return rm
	}
	rm := &routeMetrics{replayed: m.replayed.WithLabelValues(r), dead: m.dead.WithLabelValues(r), expired: m.expired.WithLabelValues(r),
		cancelled: m.cancelled.WithLabelValues(r), sends: m.sends.WithLabelValues(r), retries: m.retries.WithLabelValues(r), age: m.age.WithLabelValues(r)}
	m.routes[r] = rm
	return rm
}

// Routes lists the routes seen so far, sorted.
func (m *Metrics) Routes() []string {
	m.mu.Lock()
	defer m.mu.Unlock()
	return slices.Sorted(maps.Keys(m.routes))
}
