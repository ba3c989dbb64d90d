package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
)

// Rollouts is what the rule rollouts page reads and changes: the rules
// topic (through an Operator that validates and audits), the limiters'
// impact counts in Redis, and the rollout audit log.
type Rollouts struct {
	Operator *rollout.Operator
	Redis    redis.UniversalClient
	Audit    *rollout.DynamoAudit
}

type impactRow struct {
	Priority       string
	Total, Blocked int64
	Share          float64
	Over           bool // above the version's maximum (critical only)
}

// classRow is one class of a candidate's traffic judged against its parent,
// since the candidate began and over the recent window.
type classRow struct {
	rollout.ClassJudged
	CandShare, ParentShare float64
	RecentN                int64
	RecentDiff             float64
}

// classRows judges a candidate's classes (full) as the controller does by
// default, with the recent window's figures beside them (recent, may be nil).
func classRows(full, recentFull map[rollout.FullClass]rollout.Paired) ([]classRow, float64) {
	gate := rollout.DefaultClassGate()
	recent := map[string]rollout.Paired{}
	for c, p := range rollout.ClassesOf(recentFull) {
		recent[c.String()] = p
	}
	var rows []classRow
	conf, judged := 1.0, false
	for _, j := range rollout.JudgeClasses(rollout.ClassesOf(full), gate.Limits, gate.MinClass) {
		n := float64(max(j.N, 1))
		rp := recent[j.Class.String()]
		rows = append(rows, classRow{ClassJudged: j, CandShare: float64(j.Cand) / n, ParentShare: float64(j.Parent) / n, RecentN: rp.N, RecentDiff: rp.Diff()})
		if j.Verdict != rollout.ClassFew {
			conf, judged = min(conf, j.Confidence), true
		}
	}
	if !judged {
		conf = 0
	}
	return rows, conf
}

type rolloutsView struct {
	Title      string
	Topic      string
	Enforced   *rollout.Entry
	Watching   bool
	WatchUntil time.Time
	EnfImpact  []impactRow
	Candidate  *rollout.Entry
	ShadowEnds time.Time
	CandImpact []impactRow
	CandErrors int64
	// CandClasses are the candidate's classes judged against its parent on
	// the same decisions (the controller's default class gate), the worst
	// first, with the recent window's figures; CandConfidence the lowest
	// confidence of the judged ones.
	CandClasses    []classRow
	CandConfidence float64
	RecentWindow   time.Duration
	// At a step of the gradual rollout: the steps (StepRows), when the step
	// is watched until, its classes judged since it began (what gates the
	// next step) with their lowest confidence, and the classes of the
	// decisions the candidate answered at it.
	StepRows       []stepRow
	StepEnds       time.Time
	StepClasses    []classRow
	StepConfidence float64
	SliceClasses   []classRow
	Diff           []rollout.DiffLine
	Added          int
	Removed        int
	Versions       []rollout.Entry
	Audit          []rollout.AuditEntry
	Defaults       rollout.Params
	Form           rolloutForm
	Done           string
	Note           string
	editState
}

type rolloutForm struct {
	Rules, Shadow, Watch, MaxBlock, MinCritical, Steps, StepWindow, WhatIf string
}

// stepRow is one step of a gradual rollout on the page.
type stepRow struct {
	N       int
	Percent string
	State   string // done, current, next
}

// stepRows lists c's steps after its shadow period.
func stepRows(c rollout.Entry) []stepRow {
	var rows []stepRow
	for i, bp := range c.StepList() {
		r := stepRow{N: i + 1, Percent: strconv.FormatFloat(float64(bp)/100, 'f', -1, 64) + " %", State: "next"}
		switch {
		case int64(i+1) < c.Step:
			r.State = "done"
		case int64(i+1) == c.Step:
			r.State = "current"
		}
		rows = append(rows, r)
	}
	return rows
}

var rolloutDone = map[string]string{
	"started":    "Rollout started: every limiter judges the candidate in shadow from its next fetch of the rules topic (under a second).",
	"aborted":    "Candidate aborted: every limiter drops it from its next fetch.",
	"rolledback": "Rolled back: every limiter enforces the parent version again from its next fetch.",
	"promoted":   "Candidate enforced: every limiter enforces it from its next fetch; the controller watches it.",
	"steprolled": "Rolled back at its step: every limiter answers every principal with the parent version again from its next fetch.",
}

func impactRows(c rollout.Counts, max float64) []impactRow {
	rows := make([]impactRow, 0, len(rollout.Priorities))
	for _, p := range rollout.Priorities {
		r := impactRow{Priority: p, Total: c.Total[p], Blocked: c.Blocked[p], Share: c.Share(p)}
		r.Over = p == "critical" && r.Share > max
		rows = append(rows, r)
	}
	return rows
}

func (s *Server) loadRollouts(r *http.Request) rolloutsView {
	def := rollout.DefaultParams()
	v := rolloutsView{Title: "Rule rollouts", editState: editStateFor(r), Defaults: def,
		Form: rolloutForm{Shadow: def.ShadowFor.String(), Watch: def.WatchFor.String(),
			MaxBlock: strconv.FormatFloat(100*def.MaxShare, 'f', -1, 64), MinCritical: strconv.FormatInt(def.MinCritical, 10),
			Steps: def.Steps, StepWindow: def.StepWindow.String(), WhatIf: defaultWhatIfSpan}}
	ro := s.cfg.Rollouts
	if ro == nil {
		v.Note = "No rules topic is configured (FLOODGATE_RULES_TOPIC): the limiters serve their rules files."
		v.CanEdit = false
		return v
	}
	v.Topic = ro.Operator.Topic.Name
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	st, err := ro.Operator.Topic.Read(ctx)
	if err != nil {
		v.readOnly("The rules topic could not be read (Kafka " + v.Topic + "): " + err.Error())
		return v
	}
	now := s.cfg.Now()
	impact := func(ver int64) rollout.Impact {
		im, err := rollout.ReadImpact(ctx, ro.Redis, v.Topic, ver)
		if err != nil {
			v.Errors = append(v.Errors, "Live impact could not be read (Redis): "+err.Error())
		}
		return im
	}
	if e, ok := st.Enforced(); ok {
		v.Enforced = &e
		if v.Watching = rollout.Watching(e, now); v.Watching {
			v.WatchUntil = e.TS.Add(e.WatchFor())
			v.EnfImpact = impactRows(impact(e.Version).Enforced, e.MaxShare())
		}
	}
	if c, ok := st.Candidate(); ok {
		v.Candidate = &c
		v.ShadowEnds = c.TS.Add(c.ShadowFor())
		im := impact(c.Version)
		v.CandImpact, v.CandErrors = impactRows(im.Shadow, c.MaxShare()), im.Shadow.Errors
		v.RecentWindow = rollout.DefaultWindow
		if err := rollout.ReadRecent(ctx, ro.Redis, v.Topic, &im, v.RecentWindow, now); err != nil {
			v.Errors = append(v.Errors, "Recent impact could not be read (Redis): "+err.Error())
		}
		v.CandClasses, v.CandConfidence = classRows(im.Classes, im.RecentClasses)
		v.StepRows = stepRows(c)
		if c.Step > 0 {
			v.StepEnds = c.TS.Add(c.StepWindow())
			if err := rollout.ReadStep(ctx, ro.Redis, v.Topic, &im, c.Step); err != nil {
				v.Errors = append(v.Errors, "The step's impact could not be read (Redis): "+err.Error())
			}
			v.StepClasses, v.StepConfidence = classRows(im.StepClasses, nil)
			v.SliceClasses, _ = classRows(im.StepSlice, nil)
		}
		old := ""
		if v.Enforced != nil {
			old = v.Enforced.Rules
		}
		v.Diff = rollout.Diff(old, c.Rules)
		v.Added, v.Removed = rollout.DiffStat(v.Diff)
	}
	v.Versions = st.Versions()
	if len(v.Versions) > 20 {
		v.Versions = v.Versions[:20]
	}
	if ro.Audit != nil {
		if v.Audit, err = ro.Audit.History(ctx, 30); err != nil {
			v.Errors = append(v.Errors, "Rollout audit log unavailable: "+err.Error())
		}
	}
	return v
}

func (s *Server) rolloutsPage(w http.ResponseWriter, r *http.Request) {
	v := s.loadRollouts(r)
	v.Done = rolloutDone[r.URL.Query().Get("done")]
	if len(v.Errors) > 0 && v.Versions == nil {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	s.render(w, r, "rollouts", v)
}

// rolloutStart proposes the posted rules as a candidate in shadow.
func (s *Server) rolloutStart(w http.ResponseWriter, r *http.Request) {
	f := rolloutForm{Rules: strings.ReplaceAll(r.PostFormValue("rules"), "\r\n", "\n"), Shadow: strings.TrimSpace(r.PostFormValue("shadow")),
		Watch: strings.TrimSpace(r.PostFormValue("watch")), MaxBlock: strings.TrimSpace(r.PostFormValue("max_block")),
		MinCritical: strings.TrimSpace(r.PostFormValue("min_critical")), Steps: strings.TrimSpace(r.PostFormValue("steps")),
		StepWindow: strings.TrimSpace(r.PostFormValue("step_window")), WhatIf: strings.TrimSpace(r.PostFormValue("whatif"))}
	s.rolloutChange(w, r, rollout.ActionPropose, "started", &f, func(ctx context.Context, op *rollout.Operator, a rollout.Actor) error {
		p, err := f.params()
		if err != nil {
			return err
		}
		if strings.TrimSpace(a.Reason) == "" { // before the gate's verdict is added to it
			return errors.New("reason: required (who changed the rules, and why)")
		}
		if p.WhatIf, err = s.rolloutWhatIf(ctx, op, f.Rules, f.WhatIf); err != nil {
			return err
		}
		if p.WhatIf != "" {
			a.Reason += " [" + p.WhatIf + "]"
		}
		_, err = op.Propose(ctx, f.Rules, p, a)
		return err
	})
}

// defaultWhatIfSpan is how much recorded traffic a rollout's first gate
// replays by default (the command line's -whatif default).
const defaultWhatIfSpan = "10m"

// errWhatIfRejected: the first gate refused the rollout.
type errWhatIfRejected string

func (e errWhatIfRejected) Error() string { return string(e) }

// rolloutWhatIf is a rollout's first gate, as the command line's: the
// decisions recorded over the last span replayed through the candidate
// against the enforced version (pkg/whatif). A reject verdict refuses the
// rollout before anything is published; otherwise the verdict, in words,
// goes on the rollout's record. span "0" skips it ("" returned).
func (s *Server) rolloutWhatIf(ctx context.Context, op *rollout.Operator, rules, span string) (string, error) {
	if span == "0" {
		return "", nil
	}
	if span == "" {
		span = defaultWhatIfSpan
	}
	d, err := time.ParseDuration(span)
	if err != nil || d <= 0 || d > 24*time.Hour {
		return "", errInvalidForm(`whatif: a duration in (0, 24h] of recorded traffic, such as 10m, or "0" to skip the gate`)
	}
	candidate, err := limiter.ParseRules("candidate", []byte(rules))
	if err != nil {
		return "", err
	}
	if s.cfg.WhatIf == nil {
		return "", errInvalidForm(`whatif: what-if replays are not configured on this console (no decisions topic): give "0" to skip the first gate`)
	}
	baseline, baselineName, err := whatif.EnforcedBaseline(ctx, op.Topic)
	if err != nil {
		return "", err
	}
	now := s.cfg.Now()
	rep, err := s.cfg.WhatIf.run(ctx, now.Add(-d), now, whatif.Config{Candidate: candidate, Baseline: baseline, Logger: s.cfg.Log,
		CandidateName: "candidate (rollout)", BaselineName: baselineName})
	if err != nil {
		return "", fmt.Errorf("what-if gate: %w", err)
	}
	verdict := fmt.Sprintf("what-if over the last %s: %s, confidence %s, %d decisions replayed", span, rep.Verdict, rep.Confidence, rep.Replayed)
	if rep.Verdict == whatif.VerdictReject {
		return "", errWhatIfRejected(verdict + ": the rollout is refused, nothing was published (" + strings.Join(rep.Reasons, "; ") + ")")
	}
	return verdict, nil
}

func (f rolloutForm) params() (rollout.Params, error) {
	p := rollout.DefaultParams()
	var err error
	if f.Shadow != "" {
		if p.ShadowFor, err = time.ParseDuration(f.Shadow); err != nil {
			return p, errInvalidForm("shadow: a duration such as 10m")
		}
	}
	if f.Watch != "" {
		if p.WatchFor, err = time.ParseDuration(f.Watch); err != nil {
			return p, errInvalidForm("watch: a duration such as 15m")
		}
	}
	if f.MaxBlock != "" {
		pct, err := strconv.ParseFloat(f.MaxBlock, 64)
		if err != nil {
			return p, errInvalidForm("max_block: a percentage such as 5")
		}
		p.MaxShare = pct / 100
	}
	if f.MinCritical != "" {
		if p.MinCritical, err = strconv.ParseInt(f.MinCritical, 10, 64); err != nil {
			return p, errInvalidForm("min_critical: a whole number")
		}
	}
	switch f.Steps {
	case "":
	case "none":
		p.Steps = ""
	default:
		p.Steps = f.Steps
	}
	if f.StepWindow != "" {
		if p.StepWindow, err = time.ParseDuration(f.StepWindow); err != nil {
			return p, errInvalidForm("step_window: a duration such as 5m")
		}
	}
	if err := p.Validate(); err != nil {
		return p, errInvalidForm(err.Error())
	}
	return p, nil
}

type invalidForm string

func (e invalidForm) Error() string { return string(e) }

func errInvalidForm(s string) error { return invalidForm(s) }

func (s *Server) rolloutAbort(w http.ResponseWriter, r *http.Request) {
	s.rolloutChange(w, r, rollout.ActionAbort, "aborted", nil, func(ctx context.Context, op *rollout.Operator, a rollout.Actor) error {
		_, err := op.Apply(ctx, a, func(st *rollout.State) (rollout.Plan, error) { return rollout.PlanAbort(st, 0, a, s.cfg.Now()) })
		return err
	})
}

// rolloutRollback rolls a candidate at a step back (every principal gets
// the parent's answers again), or else restores the enforced version's
// parent.
func (s *Server) rolloutRollback(w http.ResponseWriter, r *http.Request) {
	done := "rolledback"
	s.rolloutChange(w, r, rollout.ActionRollback, done, nil, func(ctx context.Context, op *rollout.Operator, a rollout.Actor) error {
		_, err := op.Apply(ctx, a, func(st *rollout.State) (rollout.Plan, error) {
			if c, ok := st.Candidate(); ok && c.Step > 0 {
				return rollout.PlanStepRollback(st, c.Version, a, s.cfg.Now())
			}
			return rollout.PlanRestore(st, 0, a, s.cfg.Now())
		})
		return err
	})
}

func (s *Server) rolloutPromote(w http.ResponseWriter, r *http.Request) {
	s.rolloutChange(w, r, rollout.ActionPromote, "promoted", nil, func(ctx context.Context, op *rollout.Operator, a rollout.Actor) error {
		_, err := op.Promote(ctx, a)
		return err
	})
}

func (s *Server) rolloutChange(w http.ResponseWriter, r *http.Request, action, done string, f *rolloutForm,
	do func(context.Context, *rollout.Operator, rollout.Actor) error) {
	who := s.actor(r)
	a := rollout.Actor{Name: who.Name, Role: who.Role, Reason: who.Reason, Via: "console"}
	var err error
	if s.cfg.Rollouts == nil {
		err = errors.New("no rules topic is configured (FLOODGATE_RULES_TOPIC)")
	} else {
		ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
		err = do(ctx, s.cfg.Rollouts.Operator, a)
		cancel()
	}
	if err == nil {
		s.succeeded(w, r, action, who, map[string]any{"ok": true, "action": action}, "/sre/rollouts?done="+done)
		return
	}
	code, msg := http.StatusServiceUnavailable, err.Error()
	var inv invalidForm
	var rej errWhatIfRejected
	switch {
	case s.cfg.Rollouts == nil:
		code = http.StatusNotFound
	case errors.Is(err, rollout.ErrInProgress), errors.Is(err, rollout.ErrNoCandidate), errors.Is(err, rollout.ErrNothingToUndo),
		errors.Is(err, rollout.ErrNoEnforced), errors.Is(err, rollout.ErrHasEnforced), errors.Is(err, rollout.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, errBusy):
		code = http.StatusConflict
	case errors.As(err, &inv), errors.As(err, &rej), isRulesError(err), strings.HasPrefix(msg, "reason:"), strings.HasPrefix(msg, "rules:"), strings.HasPrefix(msg, "author:"):
		code = http.StatusUnprocessableEntity
	}
	if code >= 500 {
		s.cfg.Log.Error("action failed", "action", action, "actor", a.Name, "err", err, "correlation_id", who.CorrelationID)
	}
	s.refuse(w, r, action, code, msg, func(msg string) {
		v := s.loadRollouts(r)
		v.Errors = append([]string{msg}, v.Errors...)
		if f != nil {
			v.Form = *f
		}
		s.renderCode(w, r, code, "rollouts", v)
	})
}

// isRulesError reports an error of the limiter's rules parser ("candidate:3: …").
func isRulesError(err error) bool {
	return strings.HasPrefix(err.Error(), "candidate:") || strings.HasPrefix(err.Error(), "candidate ")
}

// ValidateRules is the console's rules check before a rollout: the limiter's own parser.
func ValidateRules(name string, b []byte) error {
	_, err := limiter.ParseRules(name, b)
	return err
}
