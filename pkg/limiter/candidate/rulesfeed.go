package candidate

import (
	"context"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
)

// RulesFeed puts the rules versions of the rules topic (floodgate.rules.v1,
// docs/rollouts.md) in force: it reads the topic from its start, validates
// the enforced version and the candidate in shadow, and swaps each into the
// store atomically. A version that does not validate is refused — the rules
// in force stay, and it is logged and counted. Until the topic holds an
// enforced version the store keeps what it was built with (a file or the
// built-in grid).
type RulesFeed struct {
	topic  *rollout.Topic
	store  *limiter.RuleStore
	impact *ImpactFlusher
	log    *slog.Logger

	feed                *rollout.Feed
	enforced, candidate int64          // versions in force (0: none from the topic)
	step                int64          // the candidate's step (0: its shadow period)
	rejected            map[int64]bool // versions refused (logged once)
	metrics             rollout.FeedMetrics
	// Applied, when set, is called after every state the feed applied (tests wait on it).
	Applied func(enforced, candidate int64)
}

// NewRulesFeed returns a feed of topic into store; impact gets the counts of
// every version it puts in force (nil: none counted).
func NewRulesFeed(topic *rollout.Topic, store *limiter.RuleStore, impact *ImpactFlusher, log *slog.Logger, reg prometheus.Registerer) *RulesFeed {
	f := &RulesFeed{topic: topic, store: store, impact: impact, log: log, rejected: map[int64]bool{},
		metrics: rollout.NewFeedMetrics(reg, "limiter_rules",
			"Rules versions from the rules topic, by role (enforced, candidate) and result (applied, rejected: invalid, the rules in force kept).",
			"The rules version in force (role enforced; 0 = a file or the built-in grid) and in shadow (role candidate; 0 = none)."),
	}
	f.feed = rollout.NewFeed(topic, f.apply)
	return f
}

// Sync reads the topic to its end and applies what it says; an error means
// the topic could not be read (the store is unchanged).
func (f *RulesFeed) Sync(ctx context.Context) error { return f.feed.Sync(ctx) }

// Run follows the topic from where Sync stopped until ctx is done, then
// closes it.
func (f *RulesFeed) Run(ctx context.Context) error {
	defer f.topic.Close()
	return f.feed.Run(ctx)
}

// Versions returns the enforced and candidate versions in force (0: none).
// Only for the goroutine that runs the feed, and tests after Applied.
func (f *RulesFeed) Versions() (enforced, candidate int64) { return f.enforced, f.candidate }

func (f *RulesFeed) parse(e rollout.Entry, role string) *limiter.Ruleset {
	if f.rejected[e.Version] {
		return nil
	}
	rs, err := limiter.ParseRules(versionName(e.Version), []byte(e.Rules))
	if err != nil {
		f.rejected[e.Version] = true
		f.metrics.Rejected(role)
		f.log.Error("rules version rejected; keeping the rules in force", "version", e.Version, "role", role,
			"enforced", f.enforced, "candidate", f.candidate, "author", e.Author, "err", err)
		return nil
	}
	rs.Version = e.Version
	return rs
}

func (f *RulesFeed) apply(st rollout.State) {
	if e, ok := st.Enforced(); ok && e.Version != f.enforced {
		if rs := f.parse(e, rollout.RoleEnforced); rs != nil {
			if f.impact != nil {
				rs.Impact = f.impact.track(e.Version, rollout.PhaseEnforced, -1)
			}
			old := f.store.Rules()
			f.store.Set(rs)
			if f.impact != nil {
				f.impact.retire(old.Impact)
			}
			f.metrics.Applied(rollout.RoleEnforced)
			f.metrics.InForce(rollout.RoleEnforced, e.Version)
			f.log.Info("rules version enforced", "version", e.Version, "previous", f.enforced, "rules", len(rs.Rules),
				"quotas", len(rs.Quotas), "author", e.Author, "reason", e.Reason)
			f.enforced = e.Version
		}
	}
	c, ok := st.Candidate()
	var rs *limiter.Ruleset
	switch {
	case ok && c.Version != f.candidate:
		rs = f.parse(c, rollout.RoleCandidate)
	case ok && c.Step != f.step:
		// The next step of the candidate in force: the same rules, a larger
		// slice, and counts of its own since the step began.
		if cur := f.store.Candidate(); cur != nil && cur.Version == c.Version {
			rs = cur.Rules
		}
	}
	switch {
	case (!ok || (c.Version != f.candidate && rs == nil)) && f.candidate != 0:
		old := f.store.Candidate()
		f.store.SetCandidate(nil)
		if f.impact != nil && old != nil {
			f.impact.retire(old.Impact)
		}
		f.log.Info("rules candidate withdrawn", "version", f.candidate, "step", f.step)
		f.candidate, f.step = 0, 0
		f.metrics.InForce(rollout.RoleCandidate, 0)
	case rs != nil:
		cand := &limiter.Candidate{Version: c.Version, Rules: rs, SliceBP: c.SliceBP()}
		if f.impact != nil {
			cand.Impact = f.impact.track(c.Version, rollout.PhaseShadow, c.Step)
		}
		old := f.store.Candidate()
		f.store.SetCandidate(cand)
		if f.impact != nil && old != nil {
			f.impact.retire(old.Impact)
		}
		f.metrics.Applied(rollout.RoleCandidate)
		f.metrics.InForce(rollout.RoleCandidate, c.Version)
		f.log.Info("rules candidate in force", "version", c.Version, "step", c.StepName(), "enforced", f.enforced, "author", c.Author, "reason", c.Reason)
		f.candidate, f.step = c.Version, c.Step
	}
	if f.Applied != nil {
		f.Applied(f.enforced, f.candidate)
	}
}
