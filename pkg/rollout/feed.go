package rollout

import (
	"context"

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

// Feed hands the states of a rollout topic to apply: Sync reads the topic to
// its end, Run follows it from there (from its start when Sync was not called
// or failed) until ctx is done. apply gets a copy of each state of its own.
// Sync, then Run, from one goroutine.
type Feed struct {
	topic *Topic
	apply func(State)
	st    State // where Sync stopped
}

// NewFeed returns a feed of topic to apply.
func NewFeed(topic *Topic, apply func(State)) *Feed {
	return &Feed{topic: topic, apply: apply}
}

// Sync reads the topic to its end and applies what it says; an error means
// the topic could not be read (nothing is applied).
func (f *Feed) Sync(ctx context.Context) error {
	st, err := f.topic.Read(ctx)
	if err != nil {
		return err
	}
	f.st = st
	f.apply(st.Clone())
	return nil
}

// Run follows the topic from where Sync stopped until ctx is done.
func (f *Feed) Run(ctx context.Context) error {
	return f.topic.Follow(ctx, f.st.Clone(), f.apply)
}
