package rollout

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Audit actions of rule rollouts (floodgate_audit_log, subject AuditSubject).
const (
	ActionBootstrap = "rules.bootstrap" // the first version, enforced at once
	ActionPropose   = "rules.rollout"   // a candidate starts in shadow
	ActionStep      = "rules.step"      // the candidate is enforced for the next slice of principals
	ActionPromote   = "rules.promote"   // the candidate is enforced
	ActionAbort     = "rules.abort"     // the candidate in shadow is withdrawn
	ActionRollback  = "rules.rollback"  // the enforced version (or a candidate at a step) is replaced by its parent
)

// Audit actions of detector parameters rollouts (subject
// ParamsAuditSubject): the same steps, named after the parameters. The
// operator, the controller and their plans speak of the rules' actions;
// DynamoAudit writes a step under its subject's name (ParamsAction).
const (
	ParamsActionBootstrap = "params.bootstrap"
	ParamsActionPropose   = "params.rollout"
	ParamsActionStep      = "params.step"
	ParamsActionPromote   = "params.promote"
	ParamsActionAbort     = "params.abort"
	ParamsActionRollback  = "params.rollback"
)

// ParamsAction is the parameters rollouts' name of the rule rollout action
// a (rules.step → params.step); an action of neither is a itself.
func ParamsAction(a string) string {
	if rest, ok := strings.CutPrefix(a, "rules."); ok {
		return "params." + rest
	}
	return a
}

// Params are a rollout's parameters, carried on its records.
type Params struct {
	ShadowFor   time.Duration // before promotion
	WatchFor    time.Duration // after promotion
	MaxShare    float64       // of CRITICAL decisions blocked, in (0, 1]
	MinCritical int64         // CRITICAL decisions judged before the share decides
	// Steps are the gradual rollout's slices of principals after the shadow
	// period ("1,10,50,100", ParseSteps; "" promotes at once), each watched
	// for StepWindow before the next.
	Steps      string
	StepWindow time.Duration
	// WhatIf is the what-if verdict on recorded traffic the rollout passed
	// as its first gate, in words ("": the gate was skipped); carried on
	// every record of the version.
	WhatIf string
}

// DefaultParams are the command line's and the console's defaults.
func DefaultParams() Params {
	return Params{ShadowFor: 10 * time.Minute, WatchFor: 15 * time.Minute, MaxShare: DefaultMaxCriticalBlockShare, MinCritical: DefaultMinCritical,
		Steps: DefaultSteps, StepWindow: 5 * time.Minute}
}

// Validate checks the parameters, naming the one that is wrong.
func (p Params) Validate() error {
	var v config.Check
	v.Require(p.ShadowFor >= time.Second && p.ShadowFor <= 7*24*time.Hour, "shadow", "%s: must be in 1s..168h", p.ShadowFor)
	v.Require(p.WatchFor >= time.Second && p.WatchFor <= 7*24*time.Hour, "watch", "%s: must be in 1s..168h", p.WatchFor)
	v.Require(p.MaxShare > 0 && p.MaxShare <= 1, "max-critical-block", "%g: must be in (0, 1] (0.05 = 5 %%)", p.MaxShare)
	v.Require(p.MinCritical >= 1 && p.MinCritical <= 1_000_000, "min-critical", "%d: must be in 1..1000000", p.MinCritical)
	v.Require(len(p.WhatIf) <= events.MaxWhatIfLen, "whatif", "at most %d characters", events.MaxWhatIfLen)
	if p.Steps != "" {
		_, err := ParseSteps(p.Steps)
		v.Require(err == nil, "steps", "%v", err)
		v.Require(p.StepWindow >= time.Second && p.StepWindow <= 7*24*time.Hour, "step-window", "%s: must be in 1s..168h", p.StepWindow)
	}
	return v.Err()
}

// Actor is who makes a change, and why.
type Actor struct {
	Name   string // an operator, or the controller's id
	Role   string // the operator's role ("" for the controller)
	Reason string
	Via    string // "cli", "console", "controller"
}

func (a Actor) check() error {
	switch {
	case strings.TrimSpace(a.Name) == "" || len(a.Name) > events.MaxAuthorLen:
		return fmt.Errorf("author: 1 to %d characters required", events.MaxAuthorLen)
	case strings.TrimSpace(a.Reason) == "":
		return fmt.Errorf("reason: required (who changed the rules, and why)")
	case len(a.Reason) > events.MaxReasonLen:
		return fmt.Errorf("reason: at most %d characters", events.MaxReasonLen)
	}
	return nil
}

func record(v int64, state events.RulesState, rules string, a Actor, created, now time.Time) events.RulesVersion {
	return events.RulesVersion{ID: uuid.Must(uuid.NewV7()).String(), TS: now.UTC().Truncate(time.Millisecond), Version: v, State: state,
		Rules: rules, Author: a.Name, Reason: a.Reason, CreatedAt: created.UTC().Truncate(time.Millisecond)}
}

// Plan is one change to the rules topic: its records, in order, and what it
// is for the audit log.
type Plan struct {
	Action  string
	Version int64 // the version the change is about
	Records []events.RulesVersion
	// Figures are what the change was decided on (the controller's
	// measured shares and confidence), kept in the audit row's after.
	Figures map[string]any
}

// PlanBootstrap publishes the first version, enforced at once (nothing to
// compare it with, nothing to roll back to).
func PlanBootstrap(st *State, rules string, a Actor, now time.Time) (Plan, error) {
	if err := a.check(); err != nil {
		return Plan{}, err
	}
	if _, ok := st.Enforced(); ok {
		return Plan{}, ErrHasEnforced
	}
	v := st.NextVersion()
	return Plan{Action: ActionBootstrap, Version: v, Records: []events.RulesVersion{record(v, events.RulesStateEnforced, rules, a, now, now)}}, nil
}

// PlanPropose starts a candidate in shadow against the enforced version.
func PlanPropose(st *State, rules string, p Params, a Actor, now time.Time) (Plan, error) {
	if err := a.check(); err != nil {
		return Plan{}, err
	}
	if err := p.Validate(); err != nil {
		return Plan{}, err
	}
	enf, ok := st.Enforced()
	if !ok {
		return Plan{}, ErrNoEnforced
	}
	if c, ok := st.Candidate(); ok {
		return Plan{}, fmt.Errorf("version %d: %w", c.Version, ErrInProgress)
	}
	if Watching(enf, now) {
		return Plan{}, fmt.Errorf("version %d is watched until %s: %w", enf.Version, enf.TS.Add(enf.WatchFor()).Format(time.RFC3339), ErrInProgress)
	}
	v := st.NextVersion()
	r := record(v, events.RulesStateShadow, rules, a, now, now)
	r.ParentVersion, r.ShadowForMs, r.WatchForMs = enf.Version, p.ShadowFor.Milliseconds(), p.WatchFor.Milliseconds()
	r.MaxCriticalBlockShare, r.MinCritical = p.MaxShare, p.MinCritical
	if p.Steps != "" {
		bps, _ := ParseSteps(p.Steps) // validated above
		r.Steps, r.StepWindowMs = FormatSteps(bps), p.StepWindow.Milliseconds()
	}
	r.Whatif = p.WhatIf
	return Plan{Action: ActionPropose, Version: v, Records: []events.RulesVersion{r}}, nil
}

// PlanPromote enforces the candidate; its watch starts now.
func PlanPromote(st *State, a Actor, now time.Time) (Plan, error) {
	return planCandidate(st, 0, a, now, ActionPromote, events.RulesStateEnforced)
}

// PlanAbort withdraws candidate version v (0: whichever is in shadow).
func PlanAbort(st *State, v int64, a Actor, now time.Time) (Plan, error) {
	return planCandidate(st, v, a, now, ActionAbort, events.RulesStateRolledBack)
}

// planCandidate moves candidate version v (0: whichever is in shadow) to
// state by action.
func planCandidate(st *State, v int64, a Actor, now time.Time, action string, state events.RulesState) (Plan, error) {
	if err := a.check(); err != nil {
		return Plan{}, err
	}
	c, ok := st.Candidate()
	if !ok || (v != 0 && c.Version != v) {
		return Plan{}, ErrNoCandidate
	}
	r := c.RulesVersion
	r.ID, r.TS, r.State, r.Author, r.Reason = uuid.Must(uuid.NewV7()).String(), now.UTC().Truncate(time.Millisecond), state, a.Name, a.Reason
	return Plan{Action: action, Version: c.Version, Records: []events.RulesVersion{r}}, nil
}

// PlanRestore rolls the enforced version v (0: whichever is enforced) back
// to its parent: the parent is published again as enforced (not watched),
// then v as rolled_back, in one produce call.
func PlanRestore(st *State, v int64, a Actor, now time.Time) (Plan, error) {
	if err := a.check(); err != nil {
		return Plan{}, err
	}
	enf, ok := st.Enforced()
	if !ok || enf.ParentVersion == 0 || (v != 0 && enf.Version != v) {
		return Plan{}, ErrNothingToUndo
	}
	parent, ok := st.Version(enf.ParentVersion)
	if !ok {
		return Plan{}, fmt.Errorf("%w: parent version %d is not on the topic", ErrNothingToUndo, enf.ParentVersion)
	}
	ts := now.UTC().Truncate(time.Millisecond)
	restored := parent.RulesVersion
	restored.ID, restored.TS, restored.State, restored.Author = uuid.Must(uuid.NewV7()).String(), ts, events.RulesStateEnforced, a.Name
	restored.Reason = fmt.Sprintf("restored by the rollback of version %d: %s", enf.Version, a.Reason)
	if len(restored.Reason) > events.MaxReasonLen {
		restored.Reason = restored.Reason[:events.MaxReasonLen]
	}
	restored.WatchForMs = 0 // a restore is not watched
	out := enf.RulesVersion
	out.ID, out.TS, out.State, out.Author, out.Reason = uuid.Must(uuid.NewV7()).String(), ts, events.RulesStateRolledBack, a.Name, a.Reason
	return Plan{Action: ActionRollback, Version: enf.Version, Records: []events.RulesVersion{restored, out}}, nil
}

// PlanRollback aborts the candidate in shadow when there is one, and
// otherwise restores the enforced version's parent.
func PlanRollback(st *State, a Actor, now time.Time) (Plan, error) {
	if _, ok := st.Candidate(); ok {
		return PlanAbort(st, 0, a, now)
	}
	return PlanRestore(st, 0, a, now)
}

// Watching reports whether the enforced version e is still watched at now.
func Watching(e Entry, now time.Time) bool {
	return e.ParentVersion != 0 && e.WatchForMs > 0 && now.Before(e.TS.Add(e.WatchFor()))
}

// Operator makes changes to the rules topic and audits each: it reads the
// topic, plans the change against what it read, claims the offset it read up
// to (Claims: two writers who read the same state cannot both publish — the
// second gets ErrConflict), publishes the change and writes the audit row.
// Publishing and auditing are not one transaction: a failed audit write is
// returned as an error after the change was published (the topic's records
// carry the author and the reason too).
type Operator struct {
	Topic *Topic
	Audit Auditor
	// Claims makes every change compare-and-set on the topic's position;
	// every deployed writer sets it (DynamoClaims). nil: no claim, for a
	// test's single writer.
	Claims Claims
	Now    func() time.Time // nil = time.Now
	// Validate checks a version's rules before it is published (the
	// limiter's ParseRules); required for Bootstrap and Propose.
	Validate func(name string, rules []byte) error
}

func (o *Operator) now() time.Time {
	if o.Now == nil {
		return time.Now()
	}
	return o.Now()
}

// Bootstrap publishes rules as the first enforced version.
func (o *Operator) Bootstrap(ctx context.Context, rules string, a Actor) (Plan, error) {
	if err := o.validate(rules); err != nil {
		return Plan{}, err
	}
	return o.do(ctx, a, func(st *State) (Plan, error) { return PlanBootstrap(st, rules, a, o.now()) })
}

// Propose starts rules as a candidate in shadow.
func (o *Operator) Propose(ctx context.Context, rules string, p Params, a Actor) (Plan, error) {
	if err := o.validate(rules); err != nil {
		return Plan{}, err
	}
	return o.do(ctx, a, func(st *State) (Plan, error) { return PlanPropose(st, rules, p, a, o.now()) })
}

// Promote enforces the candidate now, ahead of its shadow period.
func (o *Operator) Promote(ctx context.Context, a Actor) (Plan, error) {
	return o.do(ctx, a, func(st *State) (Plan, error) { return PlanPromote(st, a, o.now()) })
}

// Rollback aborts the candidate, or restores the enforced version's parent.
func (o *Operator) Rollback(ctx context.Context, a Actor) (Plan, error) {
	return o.do(ctx, a, func(st *State) (Plan, error) { return PlanRollback(st, a, o.now()) })
}

// Apply plans against the topic as it is now and publishes: plan may refuse
// (a state that changed since the caller looked).
func (o *Operator) Apply(ctx context.Context, a Actor, plan func(*State) (Plan, error)) (Plan, error) {
	return o.do(ctx, a, plan)
}

func (o *Operator) validate(rules string) error {
	if o.Validate == nil {
		return fmt.Errorf("rollout operator: no rules validator")
	}
	if len(rules) == 0 || len(rules) > events.MaxRulesYAMLLen {
		return fmt.Errorf("rules: 1 to %d characters", events.MaxRulesYAMLLen)
	}
	return o.Validate("candidate", []byte(rules))
}

func (o *Operator) do(ctx context.Context, a Actor, plan func(*State) (Plan, error)) (Plan, error) {
	st, err := o.Topic.Read(ctx)
	if err != nil {
		return Plan{}, err
	}
	p, err := plan(&st)
	if err != nil {
		return Plan{}, err
	}
	before := summary(&st)
	if err := o.publish(ctx, &st, a, p); err != nil {
		return Plan{}, err
	}
	if o.Audit == nil {
		return p, nil
	}
	for _, r := range p.Records {
		st.Apply(st.Next(), r) // the state after, for the audit row
	}
	if err := o.Audit.Audit(ctx, AuditEntry{At: o.now().UTC(), Actor: a.Name, Role: a.Role, Via: a.Via, Action: p.Action,
		Version: p.Version, Reason: a.Reason, Before: before, After: withFigures(summary(&st), p.Figures)}); err != nil {
		return p, fmt.Errorf("published, but the audit row was not written: %w", err)
	}
	return p, nil
}

// publish claims the offset st was read up to, then publishes p's records
// within half the claim's lease (so no other claim can be taken while they
// may still land). A failed publish gives the claim back only when the topic
// is read still ending where st did: a publish whose acknowledgement was lost
// may have landed, and a writer that read before it must not take the
// position again (the lease ends the claim otherwise).
func (o *Operator) publish(ctx context.Context, st *State, a Actor, p Plan) error {
	if o.Claims == nil {
		return o.Topic.Publish(ctx, p.Records...)
	}
	holder := a.Name + "/" + uuid.Must(uuid.NewV7()).String()
	if err := o.Claims.Claim(ctx, o.Topic.Name, st.Next(), holder, ClaimLease); err != nil {
		return err
	}
	pctx, cancel := context.WithTimeout(ctx, ClaimLease/2)
	err := o.Topic.Publish(pctx, p.Records...)
	cancel()
	if err != nil {
		rctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 10*time.Second)
		defer cancel()
		cur, rerr := o.Topic.Read(rctx)
		switch {
		case rerr != nil:
		case cur.Next() != st.Next():
			rerr = errors.New("the topic moved past it")
		default:
			rerr = o.Claims.Release(rctx, o.Topic.Name, st.Next(), holder)
		}
		if rerr != nil {
			return fmt.Errorf("%w (and the claim stays until its lease ends: %w)", err, rerr)
		}
		return err
	}
	return nil
}

// summary is the audit log's before/after of a change: the enforced
// version and the candidate.
func summary(st *State) map[string]any {
	out := map[string]any{}
	if e, ok := st.Enforced(); ok {
		out["enforced"] = e.Version
	}
	if c, ok := st.Candidate(); ok {
		out["candidate"] = c.Version
		if c.Step > 0 {
			out["candidate_step"] = c.Step
			out["candidate_slice_pct"] = float64(c.SliceBP()) / 100
		}
	}
	return out
}

// withFigures adds a change's figures to its audit summary.
func withFigures(out, figures map[string]any) map[string]any {
	if len(figures) > 0 {
		out["figures"] = figures
	}
	return out
}
