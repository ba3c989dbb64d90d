package chaos

import (
	"context"
	"fmt"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
)

// The rollout-class-harm rules: people (critical) and declared bots
// (best_effort) each far inside their limits; the candidate leaves people
// alone and limits every bot to one call an hour.
const (
	harmParent    = "version: 1\nrules:\n  - {id: people, tier: principal, kinds: [user], limit: 100000, period: 1s}\n  - {id: bots, tier: principal, kinds: [bot], limit: 100000, period: 1s}\n"
	harmCandidate = "version: 1\nrules:\n  - {id: people, tier: principal, kinds: [user], limit: 100000, period: 1s}\n  - {id: bots, tier: principal, kinds: [bot], limit: 1, period: 1h}\n"
)

// RolloutClassHarm runs the limiter on a rules topic and the adjuster's
// rollout controller, with people (critical) and bots (best_effort) at
// 100 checks/s each. A candidate that would block almost every bot —
// CRITICAL untouched, so the CRITICAL share alone would promote it — must be
// aborted in shadow, before any of it is enforced, on the class's rise over
// its parent, with the figures in the topic's record and the audit log, and
// without one bot answer changed.
func RolloutClassHarm(ctx context.Context, e *Env, s Size, r *Result) error {
	rig, err := startRolloutRig(ctx, e, "rollout-class-harm")
	if err != nil {
		return err
	}
	defer rig.topic.Close()
	people, bots := users("harm", 50), make([]events.Principal, 50)
	for i := range bots {
		bots[i] = events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("harmbot%d_%d", time.Now().UnixNano(), i)}
	}
	load := &Load{URL: "http://" + rig.lim.Addr, Rate: 200, Workers: 8,
		Next: func(w, i int) events.Principal {
			if (w+i)%2 == 0 {
				return people[(w*7919+i)%len(people)]
			}
			return bots[(w*7919+i)%len(bots)]
		},
		Priority: func(w, i int) string {
			if (w+i)%2 == 0 {
				return "critical"
			}
			return "best_effort"
		}}
	stop := startLoad(ctx, load)
	defer stop()
	_ = sleep(ctx, 3*time.Second)
	started := time.Now()
	params := rollout.DefaultParams() // 10 minutes of shadow: promotion is far off
	if err := rig.propose(ctx, params); err != nil {
		return err
	}
	final, err := rig.decided(ctx, 90*time.Second, "the controller aborts the candidate")
	abortedAfter := time.Since(started)
	_ = sleep(ctx, 2*time.Second)
	stop()
	if err != nil {
		return err
	}
	var botDenied, botAnswered, peopleDenied int
	for _, c := range load.Results() {
		if !c.OK {
			continue
		}
		switch c.Principal.Kind {
		case events.PrincipalBot:
			botAnswered++
			if !c.Allowed {
				botDenied++
			}
		default:
			if !c.Allowed {
				peopleDenied++
			}
		}
	}
	audited, err := rig.audited(ctx)
	if err != nil {
		return err
	}
	abortRow := audited[rollout.ActionAbort]
	r.metric("candidate", "version 2 limits every bot to 1 call an hour (best_effort), people untouched; 200 checks/s, half people (critical), half bots")
	r.metric("outcome", "version 2 %s %.1f s after it was proposed (shadow period %s): %s", final.State, abortedAfter.Seconds(), params.ShadowFor, final.Reason)
	r.metric("answers", "%d bot checks answered, %d denied; people denied %d", botAnswered, botDenied, peopleDenied)
	r.require("aborted in shadow, never enforced", final.State == events.RulesStateRolledBack, "state %s", final.State)
	r.require("on the harmed class, with its figures", strings.Contains(final.Reason, "kind=bot") || strings.Contains(final.Reason, "priority=best_effort") || strings.Contains(final.Reason, "plan="),
		"%s", final.Reason)
	r.require("no bot answer changed (affected share 0 ≤ the first step's)", botAnswered > 0 && botDenied == 0, "%d of %d denied", botDenied, botAnswered)
	r.require("the abort audited with its figures", abortRow != nil && abortRow.Actor == "adjuster/rollout" && strings.Contains(abortRow.Reason, "candidate"), "%+v", abortRow)
	return nil
}

// RolloutStepHarm runs the limiter on a rules topic and the adjuster's
// rollout controller. A candidate that limits every bot to one call an
// hour passes its shadow period on people's traffic alone (no bot calls
// yet: a class the shadow never saw), and the controller takes it to its
// first step, 1 % of principals. Then 1,000 declared bots (best_effort)
// start calling, each about every 2.5 s: the controller must roll it back at that first step on
// the class's rise over its parent, audited with its figures, and the share
// of bot calls it denied during the rollout must be at most 1 %.
func RolloutStepHarm(ctx context.Context, e *Env, s Size, r *Result) error {
	rig, err := startRolloutRig(ctx, e, "rollout-step-harm")
	if err != nil {
		return err
	}
	defer rig.topic.Close()
	people := users("stepharm", 50)
	peopleLoad := &Load{URL: "http://" + rig.lim.Addr, Rate: 200, Workers: 4,
		Next:     func(w, i int) events.Principal { return people[(w*7919+i)%len(people)] },
		Priority: func(int, int) string { return "critical" }}
	stopPeople := startLoad(ctx, peopleLoad)
	defer stopPeople()
	_ = sleep(ctx, 3*time.Second)
	params := rollout.DefaultParams()
	params.ShadowFor, params.StepWindow = 5*time.Second, 10*time.Minute // the first step is never passed in this run
	proposed := time.Now()
	if err := rig.propose(ctx, params); err != nil {
		return err
	}
	err = waitFor(ctx, 90*time.Second, "the controller takes the candidate to its first step", func() error {
		v, err := rig.candidate(ctx)
		switch {
		case err != nil:
			return err
		case v.State != events.RulesStateShadow:
			return fmt.Errorf("version 2 %s before its first step: %s", v.State, v.Reason)
		case v.Step < 1:
			return fmt.Errorf("version 2 still in shadow")
		}
		return nil
	})
	if err != nil {
		return err
	}
	stepAfter := time.Since(proposed)
	bots := make([]events.Principal, 1000)
	inSlice := 0
	for i := range bots {
		bots[i] = events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("stepbot%d_%d", time.Now().UnixNano(), i)}
		if limiter.PrincipalSlice(bots[i]) < 100 {
			inSlice++
		}
	}
	botLoad := &Load{URL: "http://" + rig.lim.Addr, Rate: 400, Workers: 8,
		Next:     func(w, i int) events.Principal { return bots[(w+i*8)%len(bots)] }, // round robin over the bots
		Priority: func(int, int) string { return "best_effort" }}
	botsFrom := time.Now()
	stopBots := startLoad(ctx, botLoad)
	defer stopBots()
	final, err := rig.decided(ctx, 120*time.Second, "the controller rolls the candidate back at its step")
	rolledAt := time.Now()
	_ = sleep(ctx, 2*time.Second)
	stopBots()
	stopPeople()
	if err != nil {
		return err
	}
	var botAnswered, botDenied, peopleDenied int
	deniedBots := map[string]bool{}
	for _, c := range botLoad.Results() {
		if !c.OK || c.Start.After(rolledAt) {
			continue
		}
		botAnswered++
		if !c.Allowed {
			botDenied++
			deniedBots[c.Principal.ID] = true
		}
	}
	for _, c := range peopleLoad.Results() {
		if c.OK && !c.Allowed {
			peopleDenied++
		}
	}
	affected := float64(botDenied) / float64(max(botAnswered, 1))
	audited, err := rig.audited(ctx)
	if err != nil {
		return err
	}
	stepRow, rollbackRow := audited[rollout.ActionStep], audited[rollout.ActionRollback]
	figures := func(row *rollout.AuditEntry) map[string]any {
		if row == nil {
			return nil
		}
		f, _ := row.After["figures"].(map[string]any)
		return f
	}
	r.metric("candidate", "version 2 limits every bot to 1 call an hour (best_effort), people untouched; steps %s %%, shadow %s; people (critical) at 200 checks/s throughout, 1,000 bots at 400 checks/s from the first step on", params.Steps, params.ShadowFor)
	if stepRow != nil {
		r.metric("first step", "reached %.1f s after the proposal: %s", stepAfter.Seconds(), stepRow.Reason)
	}
	r.metric("outcome", "version 2 %s %.1f s after the bots began, at step %d: %s", final.State, rolledAt.Sub(botsFrom).Seconds(), final.Step, final.Reason)
	r.metric("slice", "%d of %d bots (%.2f %%) hash into the 1 %% slice; %d bots were denied at least once", inSlice, len(bots), 100*float64(inSlice)/float64(len(bots)), len(deniedBots))
	r.metric("affected", "%d of %d bot checks denied during the rollout (%.2f %%); people denied %d", botDenied, botAnswered, 100*affected, peopleDenied)
	r.require("rolled back at its first step", final.State == events.RulesStateRolledBack && final.Step == 1, "state %s at step %d", final.State, final.Step)
	r.require("on the harmed class, with its figures", strings.Contains(final.Reason, "kind=bot") || strings.Contains(final.Reason, "priority=best_effort"), "%s", final.Reason)
	r.require("the share of bot checks affected ≤ the first step's 1 %", botAnswered > 0 && affected <= 0.01, "%.2f %% of %d", 100*affected, botAnswered)
	r.require("only principals of the slice affected", func() bool {
		for id := range deniedBots {
			if limiter.PrincipalSlice(events.Principal{Kind: events.PrincipalBot, ID: id}) >= 100 {
				return false
			}
		}
		return true
	}(), "%d bots denied", len(deniedBots))
	r.require("people never denied", peopleDenied == 0, "%d denied", peopleDenied)
	r.require("the step audited with its figures", stepRow != nil && stepRow.Actor == "adjuster/rollout" && figures(stepRow) != nil, "%+v", stepRow)
	r.require("the rollback audited with its figures", rollbackRow != nil && rollbackRow.Actor == "adjuster/rollout" && figures(rollbackRow)["step"] == float64(1),
		"%+v", rollbackRow)
	return nil
}

// rolloutRig is what both rollout scenarios start: a stack, the rules topic
// bootstrapped with harmParent, the limiter on the topic and the adjuster's
// rollout controller. The caller closes topic.
type rolloutRig struct {
	topic *rollout.Topic
	audit *rollout.DynamoAudit
	op    *rollout.Operator
	sre   rollout.Actor
	lim   *Service
}

func startRolloutRig(ctx context.Context, e *Env, scenario string) (*rolloutRig, error) {
	rd, b, prefix, err := e.StartStackTables(ctx)
	if err != nil {
		return nil, err
	}
	const topicName = "floodgate.rules.v1"
	topic := rollout.NewTopic([]string{b.Addr}, nil, topicName, e.Log)
	rig := &rolloutRig{topic: topic, sre: rollout.Actor{Name: "chaos", Reason: scenario, Via: "cli"}}
	table := prefix + dynamo.TableAuditLog
	rig.audit = &rollout.DynamoAudit{Client: e.DB(), Table: table}
	rig.op = &rollout.Operator{Topic: topic, Audit: rig.audit, Claims: &rollout.DynamoClaims{Client: e.DB(), Table: table},
		Validate: func(name string, b []byte) error { _, err := limiter.ParseRules(name, b); return err }}
	fail := func(err error) (*rolloutRig, error) { topic.Close(); return nil, err }
	if _, err := rig.op.Bootstrap(ctx, harmParent, rig.sre); err != nil {
		return fail(fmt.Errorf("bootstrap rules: %w", err))
	}
	if rig.lim, err = e.StartLimiter(ctx, b, rd, "", "FLOODGATE_RULES_TOPIC="+topicName, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT="); err != nil {
		return fail(err)
	}
	if _, err := e.startService(ctx, "adjuster", []string{
		"FLOODGATE_REDIS_ADDRS=" + rd.Addr, "FLOODGATE_KAFKA_BROKERS=" + b.Addr,
		"FLOODGATE_DYNAMODB_ENDPOINT=" + e.DynamoEndpoint, "FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix,
		"FLOODGATE_INFLUX_URL=" + closedURL(), "FLOODGATE_RULES_TOPIC=" + topicName, "FLOODGATE_ADJUSTER_ROLLOUT_WINDOW=30s",
	}); err != nil {
		return fail(err)
	}
	return rig, nil
}

// propose proposes harmCandidate (it becomes version 2) with params.
func (rig *rolloutRig) propose(ctx context.Context, params rollout.Params) error {
	if _, err := rig.op.Propose(ctx, harmCandidate, params, rig.sre); err != nil {
		return fmt.Errorf("propose the candidate: %w", err)
	}
	return nil
}

// candidate reads the latest record of the candidate, version 2, from the
// rules topic.
func (rig *rolloutRig) candidate(ctx context.Context) (rollout.Entry, error) {
	st, err := rig.topic.Read(ctx)
	if err != nil {
		return rollout.Entry{}, err
	}
	v, ok := st.Version(2)
	if !ok {
		return rollout.Entry{}, fmt.Errorf("version 2 not on the topic")
	}
	return v, nil
}

// decided waits up to timeout for the controller to take the candidate out
// of shadow and its steps (enforced, aborted or rolled back) and returns its
// record; what names the wait in the error.
func (rig *rolloutRig) decided(ctx context.Context, timeout time.Duration, what string) (rollout.Entry, error) {
	var final rollout.Entry
	err := waitFor(ctx, timeout, what, func() error {
		v, err := rig.candidate(ctx)
		if err != nil {
			return err
		}
		if v.State == events.RulesStateShadow {
			return fmt.Errorf("version 2 still at %s", v.StepName())
		}
		final = v
		return nil
	})
	return final, err
}

// audited reads the ten newest rollout audit records and returns the newest of
// each action among them.
func (rig *rolloutRig) audited(ctx context.Context) (map[string]*rollout.AuditEntry, error) {
	hist, err := rig.audit.History(ctx, 10)
	if err != nil {
		return nil, fmt.Errorf("read the rollout audit: %w", err)
	}
	newest := map[string]*rollout.AuditEntry{}
	for i := range hist {
		if newest[hist[i].Action] == nil {
			newest[hist[i].Action] = &hist[i]
		}
	}
	return newest, nil
}
