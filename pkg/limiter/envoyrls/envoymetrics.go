package envoyrls

import (
	"strings"
	"sync"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
)

// maxDetailedSeries bounds the descriptor series detailed_metric creates
// (one per distinct descriptor value); past it they are counted under
// overflowDescriptor, so a client sending random values cannot grow the
// limiter's memory or the metrics backend without bound.
const maxDetailedSeries = 1000

const overflowDescriptor = "_overflow"

// envoyDescriptorMetrics are envoy ratelimit's per-descriptor stats
// (ratelimit.service.rate_limit.<domain>.<descriptor>.total_hits, over_limit,
// near_limit, within_limit, shadow_mode) as Prometheus counters with domain
// and descriptor labels. The descriptor is the limit's configuration path
// (key_value.key…), or with detailed_metric the call's own entries.
type envoyDescriptorMetrics struct {
	hits *prometheus.CounterVec

	mu       sync.Mutex
	detailed map[string]struct{}
}

func newEnvoyDescriptorMetrics(reg prometheus.Registerer) *envoyDescriptorMetrics {
	return &envoyDescriptorMetrics{
		hits: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_limiter_envoy_descriptor_hits_total",
			Help: "Hits on envoy ratelimit descriptors with a limit, by domain, descriptor (the limit's configuration path; the call's entries with detailed_metric) and outcome (total, within_limit, near_limit, over_limit, shadow_mode): envoy ratelimit's per-descriptor stats.",
		}, []string{"domain", "descriptor", "outcome"}),
		detailed: map[string]struct{}{},
	}
}

// observe counts one descriptor's answer: hits is what it added.
func (m *envoyDescriptorMetrics) observe(domain string, d envoyconf.Descriptor, st envoyconf.Status, hits uint64) {
	if st.Limit == nil || st.Unlimited {
		return
	}
	name := strings.TrimPrefix(st.Limit.Path, domain+".")
	if st.Limit.DetailedMetric {
		name = m.detailedName(d)
	}
	add := func(outcome string) { m.hits.WithLabelValues(domain, name, outcome).Add(float64(hits)) }
	add("total")
	rpu, _, _ := st.RequestsPerUnit()
	switch {
	case st.Shadowed:
		add("shadow_mode")
	case st.Code == envoyconf.CodeOverLimit || st.QuotaExceeded:
		add("over_limit")
	case rpu > 0 && st.Count*5 >= uint64(rpu)*4: // envoy ratelimit's near-limit ratio, 0.8
		add("near_limit")
		add("within_limit")
	default:
		add("within_limit")
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
