package rollout

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
	"github.com/redis/go-redis/v9"
	"golang.org/x/sync/errgroup"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// DefaultWindow is the controller's recent window; ValidWindow bounds it.
const DefaultWindow = 5 * time.Minute

// ValidWindow checks a recent window: 10s..1h (the slots of the windowed
// counts are 10 s and kept 2 h), or 0 for cumulative shares only.
func ValidWindow(w time.Duration) error {
	if w != 0 && (w < 10*time.Second || w > time.Hour) {
		return fmt.Errorf("%s: must be in 10s..1h (0: judge cumulative shares only)", w)
	}
	return nil
}

// Verdict is the controller's judgement of the rollout in progress.
type Verdict struct {
	Action  string // ActionPromote, ActionAbort, ActionRollback, or "" (wait)
	Version int64
	Reason  string // why (for an action), or what it waits for
	// Classes are a shadow's classes judged since the candidate began, the
	// worst first; Confidence is the lowest confidence of the judged ones
	// that their rise is within its limit (0 with none judged).
	Classes    []ClassJudged
	Confidence float64
	// Step is the candidate's step (0: its shadow period) and SliceBP the
	// principals it is enforced for, in basis points. StepClasses are its
	// classes judged since the step began (what gates the next step), with
	// their lowest confidence StepConfidence; SliceClasses those of the
	// decisions it answered at the step.
	Step, SliceBP             int64
	StepClasses, SliceClasses []ClassJudged
	StepConfidence            float64
}

// ClassGate is how a candidate's classes are judged: each class's limit on
// the rise of its block share over the parent's, and the decisions a class
// needs before it is judged at all.
type ClassGate struct {
	Limits   ClassLimits
	MinClass int64
	// MaxLost is the share of the decisions its parent penalizes that a
	// candidate may stop penalizing (Impact.Lost) before it is aborted or
	// rolled back, once at least MinLost of them were counted; 0: not
	// judged (the rules: a rule candidate that blocks less harms nobody).
	// The detector's parameters set it: a candidate that raises thresholds
	// gives up penalties, which is harm when it is the abusers'.
	MaxLost float64
	MinLost int64
}

// DefaultMinLost is how many parent-penalized decisions the lost share
// needs before it decides.
const DefaultMinLost = 1000

// lost judges im's lost share against the gate: "" within it (or not
// judged yet), else the figures.
func (g ClassGate) lost(im Impact) string {
	if g.MaxLost <= 0 || im.Lost.Parent < max(g.MinLost, 1) || im.Lost.Share() <= g.MaxLost {
		return ""
	}
	return fmt.Sprintf(", lost %d of the %d decisions its parent penalizes (%s > %s)", im.Lost.Lost, im.Lost.Parent, pct(im.Lost.Share()), pct(g.MaxLost))
}

// DefaultMinClass is how many decisions a class needs to be judged.
const DefaultMinClass = 100

// DefaultClassGate is DefaultClassLimits with DefaultMinClass.
func DefaultClassGate() ClassGate {
	return ClassGate{Limits: DefaultClassLimits(), MinClass: DefaultMinClass}
}

// judgeClasses judges the classes of a shadow, cumulative and recent: the
// first harmful class (either), and the cumulative judgement.
func (g ClassGate) judgeClasses(im Impact) (all []ClassJudged, harm string, conf float64) {
	if len(im.Classes) == 0 {
		return nil, "", 0
	}
	all, conf = g.judge(im.Classes)
	if all[0].Verdict == ClassHarm {
		return all, ": " + all[0].String(), conf
	}
	if len(im.RecentClasses) > 0 {
		if r := JudgeClasses(ClassesOf(im.RecentClasses), g.Limits, g.MinClass); r[0].Verdict == ClassHarm {
			return all, fmt.Sprintf(", last %s: %s", im.Window, r[0]), conf
		}
	}
	return all, "", conf
}

// ImpactOf returns the impact counts of a version.
type ImpactOf func(ctx context.Context, v int64) (Impact, error)

// Judge decides what the rollout in st needs at now. A share decides once
// at least the version's minimum of CRITICAL decisions was judged; it is
// judged since the version began (cumulative) and, when the impact carries
// one, over the recent window too — so a version that turns bad late in a
// long period is caught even though the good traffic before it dilutes the
// cumulative share:
//   - a candidate in shadow whose CRITICAL would-block share, cumulative or
//     recent, is above its maximum is aborted; after its shadow period, with
//     enough CRITICAL decisions judged and both shares within bounds, it is
//     promoted;
//   - an enforced version under watch whose CRITICAL block share, cumulative
//     or recent, is above its maximum is rolled back to its parent.
func Judge(ctx context.Context, st *State, impact ImpactOf, now time.Time) (Verdict, error) {
	return JudgeWith(ctx, st, impact, now, DefaultClassGate())
}

// JudgeWith is Judge with the class gate g. Besides CRITICAL's absolute
// share, a candidate is judged on every class of its traffic (priority,
// principal kind, route, plan: ClassesOf): the rise of its block share over
// its parent's on the same decisions, with a one-sided ConfidenceLevel
// interval from the class's decisions (Paired.Interval).
//   - a class whose rise is above its limit with confidence — since the
//     candidate began, over the recent window, since its step began, or on
//     the decisions it answered at its step — aborts the candidate in
//     shadow, or rolls it back to its parent at a step, with the class's
//     figures;
//   - it leaves the shadow period only once every class with at least
//     g.MinClass decisions is within its limit with confidence (a class
//     whose interval straddles its limit keeps it waiting): to its first
//     step, or promoted at once when it has no steps;
//   - at a step (docs/rollouts.md, Gradual rollout) it is watched for its
//     window, then goes to the next step — or, after the last, is promoted
//     — only once every class judged since the step began is within its
//     limit with confidence, and at least one class was judged.
func JudgeWith(ctx context.Context, st *State, impact ImpactOf, now time.Time, g ClassGate) (Verdict, error) {
	if c, ok := st.Candidate(); ok {
		im, err := impact(ctx, c.Version)
		if err != nil {
			return Verdict{}, err
		}
		return judgeCandidate(c, im, now, g), nil
	}
	e, ok := st.Enforced()
	if !ok || !Watching(e, now) {
		return Verdict{}, nil
	}
	im, err := impact(ctx, e.Version)
	if err != nil {
		return Verdict{}, err
	}
	j := judgeShare("CRITICAL block share", im.Enforced, im.RecentEnforced, im.Window, e)
	if j.over != "" {
		return Verdict{Action: ActionRollback, Version: e.Version,
			Reason: fmt.Sprintf("enforced%s; parent version %d restored", j.over, e.ParentVersion)}, nil
	}
	return Verdict{Version: e.Version, Reason: fmt.Sprintf("watched until %s; %s", e.TS.Add(e.WatchFor()).Format(time.RFC3339), j.desc)}, nil
}

// judgeCandidate judges candidate c, in shadow or at a step, on its impact.
func judgeCandidate(c Entry, im Impact, now time.Time, g ClassGate) Verdict {
	classes, harm, conf := g.judgeClasses(im)
	v := Verdict{Version: c.Version, Classes: classes, Confidence: conf, Step: c.Step, SliceBP: c.SliceBP()}
	steps := c.StepList()
	stepped := c.Step > 0
	if stepped {
		v.StepClasses, v.StepConfidence = g.judge(im.StepClasses)
		v.SliceClasses, _ = g.judge(im.StepSlice)
		switch {
		case harm != "":
		case len(v.StepClasses) > 0 && v.StepClasses[0].Verdict == ClassHarm:
			harm = fmt.Sprintf(", since %s began: %s", c.StepName(), v.StepClasses[0])
		case len(v.SliceClasses) > 0 && v.SliceClasses[0].Verdict == ClassHarm:
			harm = fmt.Sprintf(", on the decisions it answered at %s: %s", c.StepName(), v.SliceClasses[0])
		}
	}
	j := judgeShare("CRITICAL would-block share", im.Shadow, im.RecentShadow, im.Window, c)
	fail, where := ActionAbort, "shadow"
	if stepped {
		fail, where = ActionRollback, c.StepName()
	}
	restored := ""
	if stepped {
		restored = fmt.Sprintf("; parent version %d answers every principal again", c.ParentVersion)
	}
	lost := g.lost(im)
	switch {
	case j.over != "":
		v.Action, v.Reason = fail, where+j.over+restored
	case lost != "":
		v.Action, v.Reason = fail, where+lost+restored
	case harm != "":
		v.Action, v.Reason = fail, where+", harm beyond the class's limit"+harm+restored
	case !stepped:
		judgeShadow(&v, c, j, classes, conf, steps, now)
	default:
		judgeStep(&v, c, steps, now)
	}
	return v
}

// judgeShadow decides a candidate in its shadow period that shows no harm:
// wait, go to its first step, or (without steps) be promoted.
func judgeShadow(v *Verdict, c Entry, j shareJudged, classes []ClassJudged, conf float64, steps []int64, now time.Time) {
	switch {
	case now.Before(c.TS.Add(c.ShadowFor())):
		v.Reason = fmt.Sprintf("in shadow until %s; %s", c.TS.Add(c.ShadowFor()).Format(time.RFC3339), j.desc)
	case j.n < c.MinSamples():
		v.Reason = fmt.Sprintf("shadow period over, waiting for %d CRITICAL decisions; %s", c.MinSamples(), j.desc)
	case len(classes) > 0 && classes[0].Verdict == ClassUnsure:
		v.Reason = fmt.Sprintf("shadow period over, waiting for %s confidence: %s", pct(ConfidenceLevel), classes[0])
	case len(steps) > 0 && judgedCount(classes) == 0:
		// The confidence must hold before each step, the first included.
		v.Reason = fmt.Sprintf("shadow period over, waiting for a class with enough decisions to be judged; %s", j.desc)
	default:
		v.Action = ActionPromote
		v.Reason = fmt.Sprintf("shadow %s passed: %s ≤ %s", c.ShadowFor(), j.desc, pct(c.MaxShare()))
		switch {
		case judgedCount(classes) > 0:
			v.Reason += fmt.Sprintf("; every class judged within its limit at ≥ %s confidence (lowest %.1f %%)", pct(ConfidenceLevel), 100*conf)
		case len(classes) > 0:
			v.Reason += "; no class had enough decisions to be judged"
		}
		if len(steps) > 0 {
			v.Action = ActionStep
			v.Reason += fmt.Sprintf("; step 1 of %d: enforced for %s of principals", len(steps), bpPct(steps[0]))
		}
	}
}

// judgeStep decides a candidate at a step that shows no harm: wait, go to
// the next step, or (after the last) be promoted.
func judgeStep(v *Verdict, c Entry, steps []int64, now time.Time) {
	end := c.TS.Add(c.StepWindow())
	judged := judgedCount(v.StepClasses)
	lowest := "no class judged yet"
	if judged > 0 {
		lowest = fmt.Sprintf("lowest class confidence %.1f %% (%s)", 100*v.StepConfidence, v.StepClasses[0].Class)
	}
	switch {
	case now.Before(end):
		v.Reason = fmt.Sprintf("%s, watched until %s; %s", c.StepName(), end.Format(time.RFC3339), lowest)
	case judged == 0:
		v.Reason = fmt.Sprintf("%s window over, waiting for a class with enough decisions since it began", c.StepName())
	case v.StepClasses[0].Verdict == ClassUnsure:
		v.Reason = fmt.Sprintf("%s window over, waiting for %s confidence: %s", c.StepName(), pct(ConfidenceLevel), v.StepClasses[0])
	default:
		v.Reason = fmt.Sprintf("%s passed after %s: %d classes within their limits at ≥ %s confidence since it began (lowest %.1f %%)",
			c.StepName(), c.StepWindow(), judged, pct(ConfidenceLevel), 100*v.StepConfidence)
		if int(c.Step) < len(steps) {
			v.Action = ActionStep
			v.Reason += fmt.Sprintf("; step %d of %d: enforced for %s of principals", c.Step+1, len(steps), bpPct(steps[c.Step]))
		} else {
			v.Action = ActionPromote
			v.Reason += "; the last step: enforced"
		}
	}
}

// judgedCount counts the classes with enough decisions to be judged.
func judgedCount(js []ClassJudged) int {
	n := 0
	for _, j := range js {
		if j.Verdict != ClassFew {
			n++
		}
	}
	return n
}

// judge judges classes by the gate, the worst first, and the lowest
// confidence of those judged (0 with none).
func (g ClassGate) judge(full map[FullClass]Paired) ([]ClassJudged, float64) {
	if len(full) == 0 {
		return nil, 0
	}
	all := JudgeClasses(ClassesOf(full), g.Limits, g.MinClass)
	conf, judged := 1.0, false
	for _, j := range all {
		if j.Verdict != ClassFew {
			conf, judged = min(conf, j.Confidence), true
		}
	}
	if !judged {
		conf = 0
	}
	return all, conf
}

// Figures are the verdict's figures for its audit row: the step, the
// confidence and the worst classes judged.
func (v Verdict) Figures() map[string]any {
	out := map[string]any{"confidence": v.Confidence}
	top := func(js []ClassJudged) []string {
		var s []string
		for _, j := range js {
			if j.Verdict == ClassFew || len(s) == 5 {
				break
			}
			s = append(s, j.String())
		}
		return s
	}
	if c := top(v.Classes); len(c) > 0 {
		out["classes"] = c
	}
	if v.Step > 0 {
		out["step"], out["slice_pct"], out["step_confidence"] = v.Step, float64(v.SliceBP)/100, v.StepConfidence
		if c := top(v.StepClasses); len(c) > 0 {
			out["step_classes"] = c
		}
		if c := top(v.SliceClasses); len(c) > 0 {
			out["slice_classes"] = c
		}
	}
	return out
}

// shareJudged is one phase's CRITICAL share judged against a version's bounds.
type shareJudged struct {
	n    int64  // CRITICAL decisions since the version began
	desc string // "CRITICAL block share 7.3 % (3 of 41)", since it began
	over string // why a share is above the maximum ("" when none is), after the phase's name
}

// judgeShare judges the CRITICAL share of one phase of version v since it
// began (total) and, with a window, over the window (recent): a share is
// over once v's minimum of CRITICAL decisions was judged and it is above v's
// maximum.
func judgeShare(what string, total, recent Counts, window time.Duration, v Entry) shareJudged {
	n, b, share := total.Total["critical"], total.Blocked["critical"], total.Share("critical")
	j := shareJudged{n: n, desc: fmt.Sprintf("%s %s (%d of %d)", what, pct(share), b, n)}
	rn, rb, rshare := recent.Total["critical"], recent.Blocked["critical"], recent.Share("critical")
	switch {
	case n >= v.MinSamples() && share > v.MaxShare():
		j.over = fmt.Sprintf(": %s > %s", j.desc, pct(v.MaxShare()))
	case window > 0 && rn >= v.MinSamples() && rshare > v.MaxShare():
		j.over = fmt.Sprintf(", last %s: %s %s (%d of %d) > %s; since it began %s", window, what, pct(rshare), rb, rn, pct(v.MaxShare()), j.desc)
	}
	return j
}

// pct formats a share as "7.3 %".
func pct(x float64) string { return fmt.Sprintf("%.1f %%", 100*x) }

// Controller promotes or rolls back the rollout in progress on the impact
// the limiter replicas count, and audits every step. Exactly one controller
// runs per deployment (the adjuster's: docs/rollouts.md); it writes to the
// topic only through an Operator, which re-reads the topic and re-checks the
// version before publishing, so an operator's own step in between wins.
type Controller struct {
	Operator *Operator
	Redis    redis.UniversalClient
	ID       string        // the author of its records, e.g. "adjuster/rollout"
	Tick     time.Duration // default 1s
	// Window is the recent window a share is judged over besides since the
	// version began (DefaultWindow; 0 judges cumulative shares only).
	Window time.Duration
	// Gate judges a candidate's classes (DefaultClassGate).
	Gate ClassGate
	Now  func() time.Time
	Log  *slog.Logger

	st      atomic.Pointer[State]
	last    atomic.Pointer[Verdict]
	actions *prometheus.CounterVec
}

// NewController returns a controller; reg gets its metrics.
func NewController(op *Operator, rdb redis.UniversalClient, id string, log *slog.Logger, reg prometheus.Registerer) *Controller {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	return &Controller{Operator: op, Redis: rdb, ID: id, Tick: time.Second, Window: DefaultWindow, Gate: DefaultClassGate(), Now: time.Now, Log: log,
		actions: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "floodgate_adjuster_rollout_actions_total",
			Help:        "Rollout steps the controller took, by topic (rules, detector parameters), action (rules.step, rules.promote, rules.abort, rules.rollback: the rules' names, also on the detector parameters topic, whose audit rows say params.*) and result (ok, error).",
			ConstLabels: prometheus.Labels{"topic": op.Topic.Name}}, []string{"action", "result"})}
}

// Last is the controller's latest verdict (nil before the first).
func (c *Controller) Last() *Verdict { return c.last.Load() }

// Run follows the topic and judges the rollout in progress every Tick
// until ctx is done.
func (c *Controller) Run(ctx context.Context) error {
	g, ctx := errgroup.WithContext(ctx)
	g.Go(func() error {
		return c.Operator.Topic.Follow(ctx, State{}, func(s State) { c.st.Store(&s) })
	})
	g.Go(func() error {
		return tick.Every(ctx, c.Tick, func(ctx context.Context) {
			if st := c.st.Load(); st != nil {
				if _, err := c.Step(ctx, st); err != nil && ctx.Err() == nil {
					c.Log.Warn("rollout step", "topic", c.Operator.Topic.Name, "err", err)
				}
			}
		})
	})
	return g.Wait()
}

// errStale: the topic changed since the controller judged it.
var errStale = errors.New("the rollout changed since it was judged")

// Step judges st once and takes the verdict's action.
func (c *Controller) Step(ctx context.Context, st *State) (Verdict, error) {
	now := c.Now()
	impact := func(ctx context.Context, v int64) (Impact, error) {
		// The recent slots first, then the counts since the version began:
		// flushes only add, so the cumulative counts read second cover the
		// recent ones even when a flush lands between the two reads.
		recent := Impact{Version: v}
		if c.Window > 0 {
			if err := ReadRecent(ctx, c.Redis, c.Operator.Topic.Name, &recent, c.Window, now); err != nil {
				return Impact{}, err
			}
		}
		im, err := ReadImpact(ctx, c.Redis, c.Operator.Topic.Name, v)
		if err != nil {
			return Impact{}, err
		}
		im.Window, im.RecentShadow, im.RecentEnforced, im.RecentClasses = recent.Window, recent.RecentShadow, recent.RecentEnforced, recent.RecentClasses
		if cand, ok := st.Candidate(); ok && cand.Version == v && cand.Step > 0 {
			if err := ReadStep(ctx, c.Redis, c.Operator.Topic.Name, &im, cand.Step); err != nil {
				return Impact{}, err
			}
		}
		return im, nil
	}
	gate := c.Gate
	if gate.Limits.By == nil && gate.Limits.Default == 0 && gate.MinClass == 0 {
		gate = DefaultClassGate() // a Controller built without NewController
	}
	v, err := JudgeWith(ctx, st, impact, now, gate)
	if err != nil {
		return v, err
	}
	c.last.Store(&v)
	if v.Action == "" {
		return v, nil
	}
	a := Actor{Name: c.ID, Reason: v.Reason, Via: "controller"}
	var plan func(*State) (Plan, error)
	// sameStep refuses a plan when the candidate is no longer the one judged
	// at the step judged (an operator moved it in between).
	sameStep := func(s *State) error {
		if cand, ok := s.Candidate(); !ok || cand.Version != v.Version || cand.Step != v.Step {
			return errStale
		}
		return nil
	}
	switch {
	case v.Action == ActionPromote:
		plan = func(s *State) (Plan, error) {
			if err := sameStep(s); err != nil {
				return Plan{}, err
			}
			return PlanPromote(s, a, now)
		}
	case v.Action == ActionStep:
		plan = func(s *State) (Plan, error) {
			if err := sameStep(s); err != nil {
				return Plan{}, err
			}
			return PlanStep(s, v.Version, a, now)
		}
	case v.Action == ActionAbort:
		plan = func(s *State) (Plan, error) { return PlanAbort(s, v.Version, a, now) }
	case v.Action == ActionRollback && v.Step > 0:
		plan = func(s *State) (Plan, error) { return PlanStepRollback(s, v.Version, a, now) }
	case v.Action == ActionRollback:
		plan = func(s *State) (Plan, error) {
			if _, ok := s.Candidate(); ok {
				return Plan{}, errStale
			}
			return PlanRestore(s, v.Version, a, now)
		}
	}
	figures := v.Figures()
	withFigures := func(s *State) (Plan, error) {
		p, err := plan(s)
		p.Figures = figures
		return p, err
	}
	_, err = c.Operator.Apply(ctx, a, withFigures)
	switch {
	case errors.Is(err, errStale), errors.Is(err, ErrNoCandidate), errors.Is(err, ErrNothingToUndo), errors.Is(err, ErrConflict), errors.Is(err, ErrNoStep):
		return v, nil // someone else moved first; the next tick judges the new state
	case err != nil:
		c.actions.WithLabelValues(v.Action, "error").Inc()
		return v, fmt.Errorf("%s version %d: %w", v.Action, v.Version, err)
	}
	c.actions.WithLabelValues(v.Action, "ok").Inc()
	c.Log.Info("rollout step", "topic", c.Operator.Topic.Name, "action", v.Action, "version", v.Version, "step", v.Step, "reason", v.Reason)
	// The followed state lags the topic by up to a fetch: judge the next
	// tick on the state as published.
	if fresh, err := c.Operator.Topic.Read(ctx); err == nil {
		c.st.Store(&fresh)
	}
	return v, nil
}
