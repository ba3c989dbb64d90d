package rollout

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// Roles of a version in force, the role label of FeedMetrics.
const (
	RoleEnforced  = "enforced"
	RoleCandidate = "candidate"
)

// FeedMetrics are what a feed of a rollout topic (the limiter's rules, the
// detector's parameters) counts: the versions it read, by role and result
// (applied, rejected), and the version of each role in force (0: none).
type FeedMetrics struct {
	versions *prometheus.CounterVec
	inForce  *prometheus.GaugeVec
}

// NewFeedMetrics registers floodgate_<thing>_versions_total and
// floodgate_<thing>_version on reg, thing naming what the topic holds
// (limiter_rules, detector_params).
func NewFeedMetrics(reg prometheus.Registerer, thing, versionsHelp, inForceHelp string) FeedMetrics {
	f := promauto.With(reg)
	return FeedMetrics{
		versions: f.NewCounterVec(prometheus.CounterOpts{Name: "floodgate_" + thing + "_versions_total", Help: versionsHelp}, []string{"role", "result"}),
		inForce:  f.NewGaugeVec(prometheus.GaugeOpts{Name: "floodgate_" + thing + "_version", Help: inForceHelp}, []string{"role"}),
	}
}

// Applied counts a version of role put in force.
func (m FeedMetrics) Applied(role string) { m.versions.WithLabelValues(role, "applied").Inc() }

// Rejected counts a version of role refused (the one in force kept).
func (m FeedMetrics) Rejected(role string) { m.versions.WithLabelValues(role, "rejected").Inc() }

// InForce shows version as the one of role in force (0: none).
func (m FeedMetrics) InForce(role string, version int64) {
	m.inForce.WithLabelValues(role).Set(float64(version))
}
