package detector

import (
	"log/slog"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// Detector parameters distributed like rules (docs/detector.md, Parameters
// and their versions): versions of a score.Params document on a compacted
// topic of the rollout format (rollout.Topic, schemas/rules.v1.json with the
// document in its rules member), read from the start by every instance
// without a consumer group. The enforced version judges every principal; a
// candidate in shadow judges every event beside it on scorers of its own,
// and at a step answers for the principals of its slice
// (rollout.PrincipalSlice). A version that does not compile is refused and
// the parameters in force kept.

// ParamsSet is the parameters one event is judged with: the enforced
// version, and a candidate with its step's slice.
type ParamsSet struct {
	From      time.Time // event time from which the set applies (its newest record's ts)
	Enforced  *score.Tuned
	Candidate *score.Tuned // nil: none
	Step      int64        // the candidate's step (0: its shadow period)
	SliceBP   int64        // principals the candidate answers for, in basis points
	candCount *rollout.Counter
}

// maxParamsHistory is how many sets a detector keeps to judge late events
// by the set of their time.
const maxParamsHistory = 8

// paramsHistory is the sets in force, oldest first.
type paramsHistory struct {
	mu   sync.RWMutex
	sets []*ParamsSet
}

// at returns the set an event at ts is judged with: the newest set from at
// or before ts (the oldest for an event older than all of them), nil before
// any set. Every instance reads the same topic, so a principal's events are
// judged with the same version whichever instance holds its partition.
func (h *paramsHistory) at(ts time.Time) *ParamsSet {
	h.mu.RLock()
	defer h.mu.RUnlock()
	for i := len(h.sets) - 1; i >= 0; i-- {
		if !ts.Before(h.sets[i].From) || i == 0 {
			return h.sets[i]
		}
	}
	return nil
}

func (h *paramsHistory) push(s *ParamsSet) {
	h.mu.Lock()
	defer h.mu.Unlock()
	h.sets = append(h.sets, s)
	if len(h.sets) > maxParamsHistory {
		h.sets = h.sets[len(h.sets)-maxParamsHistory:]
	}
}

func (h *paramsHistory) latest() *ParamsSet {
	h.mu.RLock()
	defer h.mu.RUnlock()
	if len(h.sets) == 0 {
		return nil
	}
	return h.sets[len(h.sets)-1]
}

// candState is one partition's candidate: its scorers' state and, for the
// paired counts, until when each principal is penalized by either version.
type candState struct {
	version   int64
	scorer    *score.Scorer
	candPen   map[string]time.Time
	parentPen map[string]time.Time
}

// SetParams makes set the parameters of events from set.From on.
func (d *Detector) SetParams(set *ParamsSet) { d.params.push(set) }

// Params is the newest set (nil: the process's configuration).
func (d *Detector) Params() *ParamsSet { return d.params.latest() }

// observe scores ev on partition with the parameters of its time: the
// enforced version's detections, or the candidate's for a principal in its
// slice; both versions' verdicts are counted for the rollout controller.
func (d *Detector) observe(partition int, ev *events.Decision) []score.Detection {
	set := d.params.at(ev.TS)
	s := d.scorer(partition)
	if set == nil {
		return s.Observe(ev, nil)
	}
	if s.Tuned() != set.Enforced {
		s.SetTuned(set.Enforced)
	}
	dets := s.Observe(ev, nil)
	if set.Candidate == nil {
		return dets
	}
	c := d.candidate(partition, set)
	cdets := c.scorer.Observe(ev, nil)
	key := ev.Principal.Key()
	hold := d.cfg.Ladder.FirstTTL
	if hold <= 0 {
		hold = DefaultLadder().FirstTTL
	}
	candPen := penalized(c.candPen, key, cdets, ev.TS, hold)
	parentPen := penalized(c.parentPen, key, dets, ev.TS, hold)
	answered := set.SliceBP > 0 && rollout.PrincipalSlice(ev.Principal) < set.SliceBP
	prio := priorityOf(ev)
	if set.candCount != nil {
		// The absolute share a candidate is judged on is of the decisions
		// it penalizes and its parent does not: abusers make most of the
		// traffic, and both versions penalize them.
		set.candCount.Add(prio, candPen && !parentPen)
		set.candCount.AddPaired(rollout.FullClass{Priority: prio, Kind: string(ev.Principal.Kind), Plan: ev.Plan, Route: ev.Route}, candPen, parentPen, answered)
	}
	if answered {
		return cdets
	}
	return dets
}

// candidate returns partition's candidate scorer for set's candidate: a new
// one (its own IP store, state built from now) when the version changed.
func (d *Detector) candidate(partition int, set *ParamsSet) *candState {
	d.mu.Lock()
	defer d.mu.Unlock()
	c := d.cands[partition]
	if c == nil || c.version != set.Candidate.Version {
		if d.candIPs == nil || d.candIPsVersion != set.Candidate.Version {
			d.candIPs, d.candIPsVersion = score.NewIPStore(d.cfg.Score), set.Candidate.Version
		}
		c = &candState{version: set.Candidate.Version, scorer: score.New(d.cfg.Score, d.candIPs),
			candPen: map[string]time.Time{}, parentPen: map[string]time.Time{}}
		d.cands[partition] = c
	}
	if c.scorer.Tuned() != set.Candidate {
		c.scorer.SetTuned(set.Candidate)
	}
	return c
}

// penalized records dets' penalizing detections of key in pen (held for
// hold, the ladder's mildest penalty) and reports whether key is penalized
// at ts.
func penalized(pen map[string]time.Time, key string, dets []score.Detection, ts time.Time, hold time.Duration) bool {
	if penalizes(dets) {
		pen[key] = ts.Add(hold)
	}
	until, ok := pen[key]
	if ok && !ts.Before(until) {
		delete(pen, key)
		return false
	}
	return ok
}

func penalizes(dets []score.Detection) bool {
	for i := range dets {
		if dets[i].Penalize {
			return true
		}
	}
	return false
}

// priorityOf is an event's priority, the limiter's default when it has none.
func priorityOf(ev *events.Decision) string {
	if ev.Priority == "" {
		return string(events.PriorityDegraded)
	}
	return string(ev.Priority)
}

// ParamsFeed follows the detector parameters topic and gives the detector
// each version the topic enforces or rolls out: Sync reads the topic to its
// end, Run follows it from there until ctx is done (rollout.Feed).
type ParamsFeed struct {
	*rollout.Feed
	base    score.Config
	det     *Detector
	flusher *rollout.Flusher // nil: nothing counted
	log     *slog.Logger

	metrics rollout.FeedMetrics

	enforced, candidate *score.Tuned
	candStep            int64
	counted             *rollout.Counter // the candidate counted, retired with its set
	// refused versions are not compiled (nor logged) again on every fetch
	refusedEnf, refusedCand int64
}

// NewParamsFeed returns a feed of topic's versions, compiled over base, for
// det; flusher (may be nil) gets each version's counts.
func NewParamsFeed(topic *rollout.Topic, base score.Config, det *Detector, flusher *rollout.Flusher, log *slog.Logger, reg prometheus.Registerer) *ParamsFeed {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	f := &ParamsFeed{base: base, det: det, flusher: flusher, log: log, candStep: -1,
		metrics: rollout.NewFeedMetrics(reg, "detector_params",
			"Detector parameters versions read from the topic, by role (enforced, candidate) and result (applied, rejected).",
			"The detector parameters version in force (enforced) and in rollout (candidate; 0: none)."),
	}
	f.Feed = rollout.NewFeed(topic, f.Apply)
	return f
}

// Apply makes st's enforced version and candidate the detector's. A version
// that does not compile is refused: the enforced parameters in force stay
// (a refused candidate is not run).
func (f *ParamsFeed) Apply(st rollout.State) {
	changed := false
	var from time.Time
	if e, ok := st.Enforced(); ok {
		from = e.TS
		if (f.enforced == nil || f.enforced.Version != e.Version) && f.refusedEnf != e.Version {
			if tu := f.compile(e, rollout.RoleEnforced); tu != nil {
				f.enforced, changed = tu, true
			} else {
				f.refusedEnf = e.Version
			}
		}
	}
	c, ok := st.Candidate()
	switch {
	case !ok && f.candidate != nil:
		f.candidate, changed = nil, true
	case ok && (f.candidate == nil || f.candidate.Version != c.Version) && f.refusedCand != c.Version:
		if f.candidate, changed = f.compile(c, rollout.RoleCandidate), true; f.candidate == nil {
			f.refusedCand = c.Version
		}
	}
	if ok && c.TS.After(from) {
		from = c.TS
	}
	step, slice := int64(-1), int64(0)
	if ok && f.candidate != nil {
		step, slice = c.Step, c.SliceBP()
	}
	if step != f.candStep {
		changed = true
	}
	if !changed {
		return
	}
	f.candStep = step
	set := &ParamsSet{From: from, Enforced: f.enforced, Candidate: f.candidate, Step: max(step, 0), SliceBP: slice}
	if set.Enforced == nil {
		set.Enforced = score.Untuned(f.base)
	}
	f.track(set)
	f.det.SetParams(set)
	f.metrics.InForce(rollout.RoleEnforced, set.Enforced.Version)
	cv := int64(0)
	if set.Candidate != nil {
		cv = set.Candidate.Version
	}
	f.metrics.InForce(rollout.RoleCandidate, cv)
	f.log.Info("detector parameters", "enforced", set.Enforced.Version, "candidate", cv, "step", set.Step, "slice_bp", set.SliceBP)
}

// track starts counting the set's candidate (the previous counter is
// retired after its next flush). An enforced version is not counted: its absolute
// penalized share is mostly the abusers' traffic, so the controller's
// watch of an enforced version has nothing to judge it on (it judges a
// candidate against its parent on the same decisions).
func (f *ParamsFeed) track(set *ParamsSet) {
	if f.flusher == nil {
		return
	}
	if f.counted != nil {
		f.flusher.Retire(f.counted)
		f.counted = nil
	}
	if set.Candidate != nil {
		set.candCount = rollout.NewCounter(rollout.PhaseShadow)
		f.flusher.Track(set.Candidate.Version, set.Step, set.candCount)
		f.counted = set.candCount
	}
}

// compile compiles a version's document, or refuses it (nil) with the
// reason logged and counted.
func (f *ParamsFeed) compile(e rollout.Entry, role string) *score.Tuned {
	tu, err := score.ParseTuned(f.base, []byte(e.Rules), e.Version)
	if err != nil {
		f.metrics.Rejected(role)
		f.log.Error("detector parameters version rejected; keeping the parameters in force", "version", e.Version, "role", role, "err", err)
		return nil
	}
	f.metrics.Applied(role)
	return tu
}
