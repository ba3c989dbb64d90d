package envoyrls

import (
	"math"
	"strings"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/metric"
)

// maxDetailedSeries bounds the descriptor series detailed_metric creates
// (one per distinct descriptor value); past it they are counted under
// overflowDescriptor, so a client sending random values cannot grow the
// limiter's memory or the metrics backend without bound.
const maxDetailedSeries = 1000

const overflowDescriptor = "_overflow"

// envoyDescriptorMetrics are envoy ratelimit's per-descriptor stats
// (ratelimit.service.rate_limit.<domain>.<descriptor>.total_hits, over_limit,
// near_limit, within_limit, shadow_mode, over_limit_with_local_cache) as
// Prometheus counters with domain and descriptor labels. The descriptor is the limit's configuration path
// (key_value.key…), or with detailed_metric the call's own entries.
type envoyDescriptorMetrics struct {
	hits *prometheus.CounterVec

	mu       sync.Mutex
	detailed map[string]struct{}

	// limits holds, by *envoyconf.Limit, the series of a limit without
	// detailed_metric (*limitSeries), resolved as its outcomes occur: a
	// call's descriptor is counted without building its name or hashing
	// three label values per outcome. About maxCachedLimits limits at most
	// (a configuration reload brings new ones): past it, emptied.
	limits sync.Map
	cached atomic.Int64
}

// maxCachedLimits bounds envoyDescriptorMetrics.limits.
const maxCachedLimits = 4096

// The outcomes of a descriptor's answer, limitSeries' indexes.
const (
	outcomeTotal = iota
	outcomeWithin
	outcomeNear
	outcomeOver
	outcomeShadow
	outcomeCached
	outcomes
)

// outcomeName is an outcome's label value.
func outcomeName(outcome int) string {
	return [outcomes]string{"total", "within_limit", "near_limit", "over_limit", "shadow_mode", "over_limit_with_local_cache"}[outcome]
}

// limitSeries is one limit's series, by outcome, each resolved at its first use.
type limitSeries struct {
	domain, name string
	series       [outcomes]metric.Series
}

func (m *envoyDescriptorMetrics) counter(ls *limitSeries, outcome int) prometheus.Counter {
	return ls.series[outcome].Get(func() prometheus.Counter { return m.hits.WithLabelValues(ls.domain, ls.name, outcomeName(outcome)) })
}

// seriesOf is the limit's series: cached for a limit without
// detailed_metric, built for this call otherwise.
func (m *envoyDescriptorMetrics) seriesOf(domain string, d envoyconf.Descriptor, l *envoyconf.Limit) *limitSeries {
	if l.DetailedMetric {
		return &limitSeries{domain: domain, name: m.detailedName(d)}
	}
	if v, ok := m.limits.Load(l); ok {
		if ls := v.(*limitSeries); ls.domain == domain {
			return ls
		}
	}
	ls := &limitSeries{domain: domain, name: strings.TrimPrefix(l.Path, domain+".")}
	if m.cached.Load() >= maxCachedLimits { // mostly limits of configurations reloaded since
		m.limits.Clear()
		m.cached.Store(0)
	}
	if _, loaded := m.limits.LoadOrStore(l, ls); !loaded {
		m.cached.Add(1)
	}
	return ls
}

func newEnvoyDescriptorMetrics(reg prometheus.Registerer) *envoyDescriptorMetrics {
	return &envoyDescriptorMetrics{
		hits: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_limiter_envoy_descriptor_hits_total",
			Help: "Hits on envoy ratelimit descriptors with a limit, by domain, descriptor (the limit's configuration path; the call's entries with detailed_metric) and outcome (total, within_limit, near_limit, over_limit, shadow_mode, over_limit_with_local_cache): envoy ratelimit's per-descriptor stats.",
		}, []string{"domain", "descriptor", "outcome"}),
		detailed: map[string]struct{}{},
	}
}

// DefaultNearLimitRatio is envoy ratelimit's NEAR_LIMIT_RATIO default.
const DefaultNearLimitRatio = 0.8

// observe counts one descriptor's answer as envoy ratelimit's stats count
// it (its BaseRateLimiter): hits is what the call added. A hit past the
// limit is over_limit; of a call that crosses the limit, only the hits past
// it, and those between the near threshold — floor(limit × nearRatio) —
// and the limit are near_limit. An allowed call's hits are within_limit,
// and those past the near threshold near_limit as well. A shadow-mode limit
// exceeded counts over_limit and shadow_mode; an answer from the local
// cache over_limit and over_limit_with_local_cache.
func (m *envoyDescriptorMetrics) observe(domain string, d envoyconf.Descriptor, st envoyconf.Status, hits uint64, nearRatio float64) {
	if st.Limit == nil || st.Unlimited {
		return
	}
	ls := m.seriesOf(domain, d, st.Limit)
	add := func(outcome int, n uint64) {
		if n > 0 {
			m.counter(ls, outcome).Add(float64(n))
		}
	}
	add(outcomeTotal, hits)
	rpu, _, _ := st.RequestsPerUnit()
	limit := uint64(rpu)
	near := uint64(math.Floor(float64(float32(limit) * float32(nearRatio)))) // as envoy ratelimit computes it, in float32
	after := st.Count
	before := after - min(hits, after)
	switch {
	case st.Cached:
		add(outcomeOver, hits)
		add(outcomeCached, hits)
		if st.Shadowed {
			add(outcomeShadow, hits)
		}
	case st.Code == envoyconf.CodeOverLimit || st.QuotaExceeded || st.Shadowed:
		past := hits
		if before < limit {
			past = after - limit
			add(outcomeNear, limit-max(near, before))
		}
		add(outcomeOver, past)
		if st.Shadowed {
			add(outcomeShadow, past)
		}
	default:
		if after > near {
			add(outcomeNear, after-max(near, before))
		}
		add(outcomeWithin, hits)
	}
}

// detailedName is the call's descriptor as envoy ratelimit names it with
// detailed_metric ("key_value.key_value"), while fewer than
// maxDetailedSeries names exist.
func (m *envoyDescriptorMetrics) detailedName(d envoyconf.Descriptor) string {
	var b strings.Builder
	for i, e := range d.Entries {
		if i > 0 {
			b.WriteByte('.')
		}
		b.WriteString(e.Key)
		if e.Value != "" {
			b.WriteByte('_')
			b.WriteString(e.Value)
		}
	}
	name := b.String()
	m.mu.Lock()
	defer m.mu.Unlock()
	if _, ok := m.detailed[name]; ok {
		return name
	}
	if len(m.detailed) >= maxDetailedSeries {
		return overflowDescriptor
	}
	m.detailed[name] = struct{}{}
	return name
}
