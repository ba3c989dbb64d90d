package web

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"strings"
	"time"

	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// Proposals is what the tuning proposals page reads and changes: the
// proposals `detector propose` stored (floodgate_runtime_config), and the
// detector parameters topic, changed through an Operator that claims and
// audits exactly as rule rollouts do (docs/detector.md).
type Proposals struct {
	DDB      *dynamodb.Client
	Table    string // floodgate_runtime_config, with the deployment's prefix
	Operator *rollout.Operator
	Audit    *rollout.DynamoAudit
}

// ValidateParams is the console's check of a parameters document before
// it is published: its size and that it is not empty. The detector
// validates it again on load and refuses a version that does not compile.
func ValidateParams(_ string, b []byte) error {
	if len(strings.TrimSpace(string(b))) == 0 {
		return errors.New("parameters: the document is empty")
	}
	return nil
}

type proposalRow struct {
	dynamo.Proposal
	Kept, Avoided string // shares, "99.5 %"
}

type proposalsView struct {
	Title     string
	Rows      []proposalRow
	Enforced  *rollout.Entry
	Candidate *rollout.Entry
	Audit     []rollout.AuditEntry
	CanApply  bool
	Defaults  rollout.Params
	Done      string
	Errors    []string
	Note      string
}

func init() {
	doneMessages["proposal_applied"] = "Proposal applied: its parameters are a candidate version in shadow on every detector from its next fetch; the controller takes it step by step and rolls it back on harm."
}

func (s *Server) loadProposals(r *http.Request) proposalsView {
	v := proposalsView{Title: "Tuning proposals", CanApply: current(r).who.Role.Allows(auth.RoleSRE), Defaults: rollout.DefaultParams()}
	if msg, ok := doneMessages[r.URL.Query().Get("done")]; ok {
		v.Done = msg
	}
	p := s.cfg.Proposals
	if p == nil {
		v.Note = "No detector parameters topic is configured (FLOODGATE_DETECTOR_PARAMS_TOPIC): proposals cannot be listed or applied."
		v.CanApply = false
		return v
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	list, err := dynamo.ListProposals(ctx, p.DDB, p.Table)
	if err != nil {
		v.Errors = append(v.Errors, err.Error())
	}
	for _, x := range list {
		v.Rows = append(v.Rows, proposalRow{Proposal: x, Kept: pctOf(x.Evidence.KeptShare()), Avoided: pctOf(x.Evidence.ClassAvoidedShare())})
	}
	st, err := p.Operator.Topic.Read(ctx)
	if err != nil {
		v.Errors = append(v.Errors, fmt.Sprintf("read %s: %v", p.Operator.Topic.Name, err))
	} else {
		if e, ok := st.Enforced(); ok {
			v.Enforced = &e
		}
		if c, ok := st.Candidate(); ok {
			v.Candidate = &c
		}
	}
	if p.Audit != nil {
		if v.Audit, err = p.Audit.History(ctx, 20); err != nil {
			v.Errors = append(v.Errors, err.Error())
		}
	}
	return v
}

func pctOf(f float64) string { return fmt.Sprintf("%.1f %%", 100*f) }

func (s *Server) proposalsPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "proposals", s.loadProposals(r))
}

func (s *Server) apiProposals(w http.ResponseWriter, r *http.Request) {
	if s.cfg.Proposals == nil {
		s.fail(w, r, http.StatusNotFound, "no detector parameters topic is configured (FLOODGATE_DETECTOR_PARAMS_TOPIC)")
		return
	}
	ctx, cancel := context.WithTimeout(r.Context(), 10*time.Second)
	defer cancel()
	list, err := dynamo.ListProposals(ctx, s.cfg.Proposals.DDB, s.cfg.Proposals.Table)
	if err != nil {
		s.fail(w, r, http.StatusServiceUnavailable, err.Error())
		return
	}
	if list == nil {
		list = []dynamo.Proposal{}
	}
	writeJSON(w, http.StatusOK, map[string]any{"proposals": list})
}

// applyRequest is POST /api/v1/proposals/apply as JSON (the page posts the
// same names as a form).
type applyRequest struct {
	ID         string `json:"id"`
	Reason     string `json:"reason"`
	Shadow     string `json:"shadow"`      // e.g. 10m (default)
	Steps      string `json:"steps"`       // e.g. 1,10,50,100 (default); "none": promoted after the shadow
	StepWindow string `json:"step_window"` // e.g. 5m (default)
}

func (s *Server) readApply(r *http.Request) (applyRequest, error) {
	return readAction(r, func() applyRequest {
		return applyRequest{ID: r.PostFormValue("id"), Reason: r.PostFormValue("reason"), Shadow: r.PostFormValue("shadow"),
			Steps: r.PostFormValue("steps"), StepWindow: r.PostFormValue("step_window")}
	})
}

// params reads an apply's rollout parameters over the defaults.
func (in applyRequest) params() (rollout.Params, error) {
	p := rollout.DefaultParams()
	var errs []error
	dur := func(name, v string, d *time.Duration) {
		if v = strings.TrimSpace(v); v == "" {
			return
		}
		x, err := time.ParseDuration(v)
		if err != nil {
			errs = append(errs, fmt.Errorf("%s: %q is not a duration (e.g. 10m)", name, v))
			return
		}
		*d = x
	}
	dur("shadow", in.Shadow, &p.ShadowFor)
	dur("step_window", in.StepWindow, &p.StepWindow)
	switch st := strings.TrimSpace(in.Steps); st {
	case "":
	case "none":
		p.Steps = ""
	default:
		p.Steps = st
	}
	if err := errors.Join(errs...); err != nil {
		return p, err
	}
	return p, p.Validate()
}

// proposalApply starts the rollout of a proposal: its parameters document
// becomes a candidate version of the detector parameters topic in shadow,
// with the replay evidence as the rollout's first gate (carried on every
// record), then steps by principal hash under the adjuster's controller.
// Role sre; the topic change is audited by the Operator (subject
// detector-params#rollout) and the proposal marked applied with the version.
func (s *Server) proposalApply(w http.ResponseWriter, r *http.Request) {
	const action = "proposal.apply"
	who := s.actor(r)
	in, err := s.readApply(r)
	if err == nil && wantsJSON(r) && in.Reason != "" {
		who.Reason = strings.TrimSpace(in.Reason)
	}
	var version int64
	if err == nil {
		version, err = s.applyProposal(r.Context(), in, who)
	}
	if err == nil {
		s.succeeded(w, r, action, who, map[string]any{"ok": true, "id": in.ID, "version": version}, "/sre/proposals?done=proposal_applied",
			"proposal", in.ID, "version", version)
		return
	}
	code := http.StatusServiceUnavailable
	switch {
	case s.cfg.Proposals == nil:
		code = http.StatusNotFound
	case errors.Is(err, errNoProposal):
		code = http.StatusNotFound
	case errors.Is(err, dynamo.ErrProposalApplied), errors.Is(err, rollout.ErrInProgress), errors.Is(err, rollout.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, store.ErrInvalid), errors.Is(err, errInvalidApply):
		code = http.StatusUnprocessableEntity
	}
	s.refuseProposal(w, r, action, who, code, err)
}

var (
	errNoProposal   = errors.New("no such proposal")
	errInvalidApply = errors.New("invalid")
)

func (s *Server) applyProposal(ctx context.Context, in applyRequest, who store.Actor) (int64, error) {
	p := s.cfg.Proposals
	if p == nil {
		return 0, errors.New("no detector parameters topic is configured (FLOODGATE_DETECTOR_PARAMS_TOPIC)")
	}
	if who.Reason == "" {
		return 0, fmt.Errorf("%w: reason: required", errInvalidApply)
	}
	params, err := in.params()
	if err != nil {
		return 0, fmt.Errorf("%w: %w", errInvalidApply, err)
	}
	ctx, cancel := context.WithTimeout(ctx, 15*time.Second)
	defer cancel()
	prop, ok, err := dynamo.GetProposal(ctx, p.DDB, p.Table, in.ID)
	if err != nil {
		return 0, err
	}
	if !ok {
		return 0, fmt.Errorf("%w: %q", errNoProposal, in.ID)
	}
	if prop.AppliedVersion != 0 {
		return 0, fmt.Errorf("%w: rolled out as version %d by %s", dynamo.ErrProposalApplied, prop.AppliedVersion, prop.AppliedBy)
	}
	ev := prop.Evidence
	params.WhatIf = fmt.Sprintf("replay of %d decisions: confirmed kept %d/%d, %s false positives avoided %d/%d, all false positives avoided %d/%d, %d new detections",
		prop.Decisions, ev.ConfirmedKept, ev.Confirmed, prop.Class(), ev.ClassFPAvoided, ev.ClassFPs, ev.FPAvoided, ev.FalsePositives, ev.NewDetections)
	a := rollout.Actor{Name: who.Name, Role: who.Role, Reason: fmt.Sprintf("proposal %s: %s", prop.ID, who.Reason), Via: "console"}
	var plan rollout.Plan
	st, err := p.Operator.Topic.Read(ctx)
	if err != nil {
		return 0, err
	}
	e, enforced := st.Enforced()
	switch {
	case enforced && prop.BaseVersion != 0 && e.Version != prop.BaseVersion,
		enforced && prop.BaseVersion == 0 && strings.TrimSpace(e.Rules) != "defaults: {}":
		return 0, fmt.Errorf("%w: the proposal was built on parameters version %d and version %d is enforced now: run detector propose again",
			dynamo.ErrProposalApplied, prop.BaseVersion, e.Version)
	}
	if !enforced {
		// The first version of the topic: the parameters in force until
		// now (the detector's environment) become version 1, enforced, so
		// that the proposal has a parent to roll back to.
		if _, err = p.Operator.Bootstrap(ctx, "defaults: {}\n", rollout.Actor{Name: who.Name, Role: who.Role, Via: "console",
			Reason: "the detector's configured parameters, the parent of proposal " + prop.ID}); err != nil {
			return 0, err
		}
	}
	if plan, err = p.Operator.Propose(ctx, prop.Params, params, a); err != nil {
		return 0, err
	}
	if err := dynamo.MarkProposalApplied(ctx, p.DDB, p.Table, prop.ID, plan.Version, who.Name, s.cfg.Now()); err != nil {
		return plan.Version, fmt.Errorf("version %d published, but the proposal was not marked applied: %w", plan.Version, err)
	}
	return plan.Version, nil
}

func init() {
	doneMessages["params_rolledback"] = "Parameters rollout stopped: every detector drops the candidate (or enforces the parent version again) from its next fetch."
}

// rollbackRequest is POST /api/v1/proposals/rollback as JSON (the page
// posts the same names as a form).
type rollbackRequest struct {
	Reason string `json:"reason"`
}

// paramsRollback stops a detector parameters rollout by hand: it aborts
// the candidate in shadow, rolls a candidate at a step back (every
// principal gets the enforced version's detections again), or, with no
// candidate, restores the enforced version's parent — as the rules'
// /sre/rollouts/abort and /sre/rollouts/rollback do. Role sre, a reason
// required; audited by the Operator under detector-params#rollout as
// params.abort or params.rollback.
func (s *Server) paramsRollback(w http.ResponseWriter, r *http.Request) {
	const action = "params.rollback"
	who := s.actor(r)
	in, err := readAction(r, func() rollbackRequest { return rollbackRequest{Reason: who.Reason} })
	who.Reason = strings.TrimSpace(in.Reason)
	var plan rollout.Plan
	switch {
	case err != nil:
	case s.cfg.Proposals == nil:
		err = errors.New("no detector parameters topic is configured (FLOODGATE_DETECTOR_PARAMS_TOPIC)")
	case who.Reason == "":
		err = fmt.Errorf("%w: reason: required", errInvalidApply)
	default:
		a := rollout.Actor{Name: who.Name, Role: who.Role, Reason: who.Reason, Via: "console"}
		ctx, cancel := context.WithTimeout(r.Context(), 15*time.Second)
		plan, err = s.cfg.Proposals.Operator.Apply(ctx, a, func(st *rollout.State) (rollout.Plan, error) {
			if c, ok := st.Candidate(); ok && c.Step > 0 {
				return rollout.PlanStepRollback(st, c.Version, a, s.cfg.Now())
			}
			return rollout.PlanRollback(st, a, s.cfg.Now())
		})
		cancel()
	}
	if err == nil {
		done := rollout.ParamsAction(plan.Action)
		s.succeeded(w, r, action, who, map[string]any{"ok": true, "action": done, "version": plan.Version}, "/sre/proposals?done=params_rolledback",
			"done", done, "version", plan.Version)
		return
	}
	code := http.StatusServiceUnavailable
	switch {
	case s.cfg.Proposals == nil:
		code = http.StatusNotFound
	case errors.Is(err, rollout.ErrNoCandidate), errors.Is(err, rollout.ErrNothingToUndo), errors.Is(err, rollout.ErrConflict):
		code = http.StatusConflict
	case errors.Is(err, errInvalidApply), errors.Is(err, store.ErrInvalid), strings.HasPrefix(err.Error(), "reason:"), strings.HasPrefix(err.Error(), "author:"):
		code = http.StatusUnprocessableEntity
	}
	s.refuseProposal(w, r, action, who, code, err)
}

// refuseProposal answers a proposals page action that failed with code
// (logged from 500), the page rendered again with the error first.
func (s *Server) refuseProposal(w http.ResponseWriter, r *http.Request, action string, who store.Actor, code int, err error) {
	if code >= 500 {
		s.cfg.Log.Error("action failed", "action", action, "actor", who.Name, "err", err, "correlation_id", who.CorrelationID)
	}
	s.refuse(w, r, action, code, err.Error(), func(msg string) {
		v := s.loadProposals(r)
		v.Errors = append([]string{msg}, v.Errors...)
		s.renderCode(w, r, code, "proposals", v)
	})
}
