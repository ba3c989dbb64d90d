package web

import (
	"context"
	"fmt"
	"log/slog"
	"strings"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/embedded"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
)

type nopPublisher struct{}

func (nopPublisher) TryPublish(kafka.Message) bool { return true }

// rolloutRig is rule rollouts on the real stack for a browser test: a rules
// topic of the test's own on the local broker, the console's operator on it
// (audited, and its changes claimed, in the console's tables), one limiter
// replica following the topic under CRITICAL traffic, and the rollout
// controller.
type rolloutRig struct {
	brokers   []string
	name      string
	decisions string // an empty decisions topic for the what-if gate
	whatIf    string // the form's first-gate span ("0" skips the gate: newRolloutRig's default)
	topic     *rollout.Topic
	audit     *rollout.DynamoAudit
	claims    *rollout.DynamoClaims
	replica   *embedded.Limiter
}

func newRolloutRig(t *testing.T) *rolloutRig {
	t.Helper()
	topic, name := rollouttest.OpenTopic(t)
	_, decisions := rollouttest.Topic(t)
	return &rolloutRig{brokers: rollouttest.Brokers(), name: name, topic: topic, decisions: decisions, whatIf: "0"}
}

// configure gives the console the rollouts, and what-if replays of a
// decisions topic of the test's own (empty: the first gate replays nothing),
// from newEnvWith's hook.
func (r *rolloutRig) configure(cfg *Config, prefix string) {
	r.audit = &rollout.DynamoAudit{Table: prefix + dynamo.TableAuditLog}
	r.claims = &rollout.DynamoClaims{Table: prefix + dynamo.TableAuditLog}
	cfg.Rollouts = &Rollouts{Operator: &rollout.Operator{Topic: r.topic, Audit: r.audit, Claims: r.claims, Validate: ValidateRules}, Audit: r.audit}
	if cfg.WhatIf == nil {
		cfg.WhatIf = &WhatIf{Timeout: 20 * time.Second,
			Source: &whatif.Source{Client: &kafka.Client{Addr: kafka.TCP(r.brokers...), Timeout: 5 * time.Second}, Topic: r.decisions, MaxEvents: 1000}}
	}
}

// start bootstraps rolloutV1, starts the replica with CRITICAL traffic of
// five bots on GET /x, and the controller (ticking every 200 ms), until the
// test ends.
func (r *rolloutRig) start(t *testing.T, e *testEnv) {
	t.Helper()
	r.audit.Client, r.claims.Client = e.ddb, e.ddb
	e.web.cfg.Rollouts.Redis = e.rdb
	if e.web.cfg.WhatIf.Redis == nil {
		e.web.cfg.WhatIf.Redis = e.rdb
	}
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	_, err := e.web.cfg.Rollouts.Operator.Bootstrap(ctx, rolloutV1, rollout.Actor{Name: "alice", Reason: "first", Via: "cli"})
	require.NoError(t, err)
	fallback, err := limiter.ParseRules("fallback", []byte(rolloutV1))
	require.NoError(t, err)
	r.replica, err = embedded.New(ctx, embedded.Config{Redis: redistest.Client(t), Rules: fallback, Publisher: nopPublisher{},
		Brokers: r.brokers, RulesTopic: r.name, Gateway: "browser", Logger: slog.New(slog.DiscardHandler), Registry: prometheus.NewRegistry()})
	require.NoError(t, err)
	done := make(chan struct{})
	go func() { _ = r.replica.Run(ctx); close(done) }()
	base := redistest.Unique(t, "rollout_browser")
	go func() {
		for i := 0; ctx.Err() == nil; i++ {
			_, _ = r.replica.Check(ctx, gateway.Request{Principal: events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("%s_%d", base, i%5)},
				IP: "203.0.113.9", Method: "GET", Route: "/x", Cost: 1, Priority: "critical"})
			time.Sleep(5 * time.Millisecond)
		}
	}()
	ctl := rollout.NewController(e.web.cfg.Rollouts.Operator, e.rdb, "adjuster/rollout", nil, prometheus.NewRegistry())
	ctl.Tick = 200 * time.Millisecond
	go func() { _ = ctl.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
}

// propose starts a rollout of rules from the console's form (2 s of shadow,
// 10 CRITICAL decisions judged before a share decides; steps as the form
// takes them, "none" for an enforcement at once).
func (r *rolloutRig) propose(e *testEnv, rules, reason string, steps ...string) chromedp.Action[chromedp.Void] {
	st := "none"
	if len(steps) > 0 {
		st = steps[0]
	}
	return chromedp.Steps(
		chromedp.Navigate(e.srv.URL+"/sre/rollouts"),
		chromedp.WaitVisible(chromedp.ID("rollout-form")),
		chromedp.SetValue(chromedp.ID("ro-rules"), rules),
		chromedp.SetValue(chromedp.ID("ro-shadow"), "2s"),
		chromedp.SetValue(chromedp.ID("ro-min"), "10"),
		chromedp.SetValue(chromedp.ID("ro-steps"), st),
		chromedp.SetValue(chromedp.ID("ro-stepwin"), "1h"),
		chromedp.SetValue(chromedp.ID("ro-whatif"), r.whatIf),
		chromedp.SendKeys(chromedp.ID("ro-reason"), reason),
		chromedp.Submit(chromedp.ID("ro-reason")),
		chromedp.WaitVisible(chromedp.ID("candidate-diff")),
	)
}

// waitState waits until version v's latest record on the topic is in state.
func (r *rolloutRig) waitState(t *testing.T, v int64, state events.RulesState) {
	t.Helper()
	require.Eventually(t, func() bool {
		st, err := r.topic.Read(context.Background())
		if err != nil {
			return false
		}
		en, ok := st.Version(v)
		return ok && en.State == state
	}, 30*time.Second, 100*time.Millisecond, "version %d should become %s", v, state)
}

// waitAudit waits until the newest rollout audit row is action on version v:
// the controller writes it after the record it publishes.
func (r *rolloutRig) waitAudit(t *testing.T, v int64, action string) {
	t.Helper()
	require.Eventually(t, func() bool {
		rows, err := r.audit.History(context.Background(), 1)
		return err == nil && len(rows) == 1 && rows[0].Version == v && rows[0].Action == action
	}, 10*time.Second, 50*time.Millisecond, "the audit row %s of version %d", action, v)
}

// TestBrowserRollouts drives rule rollouts in headless Chromium against the
// real broker, Redis and DynamoDB Local, with a real limiter replica on the
// rules topic taking CRITICAL traffic and the rollout controller running: an
// SRE starts a rollout that would block the traffic, and the controller
// aborts it by itself (the page shows it rolled back, with the measured
// share, by the controller); then a good rollout is promoted after its
// shadow period.
func TestBrowserRollouts(t *testing.T) {
	bin, shots := browserSetup(t)
	ro := newRolloutRig(t)
	e := newEnvWith(t, func(cfg *Config, prefix string) { ro.configure(cfg, prefix) })
	ro.start(t, e)

	b := startBrowser(t, bin)
	shot := func(name string) chromedp.Action[chromedp.Void] { return screenshot(shots, name) }

	// SRE: sign in, start a rollout that allows one request an hour per bot.
	require.NoError(t, chromedp.Do(b,
		signIn(e.srv.URL, "sre1"),
		ro.propose(e, rolloutV2, "INC-77 one an hour"),
		shot("console-rollout-shadow"),
	))
	require.Contains(t, textOf(t, b, "#candidate-version"), "Version 2 in shadow")
	require.Contains(t, textOf(t, b, "#candidate-diff"), "limit: 1, period: 1h")

	// The controller aborts it on the replica's counts, by itself.
	ro.waitState(t, 2, events.RulesStateRolledBack)
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/sre/rollouts"), chromedp.WaitVisible(chromedp.ID("versions")), shot("console-rollout-rolled-back")))
	require.Contains(t, textOf(t, b, "#enforced-version"), "Version 1")
	versions := textOf(t, b, "#versions")
	require.Contains(t, versions, "rolled back")
	require.Contains(t, versions, "adjuster/rollout")
	require.Contains(t, versions, "CRITICAL would-block share")
	auditText := textOf(t, b, "#rollout-audit")
	require.Contains(t, auditText, "controller")
	require.Contains(t, auditText, "rules.abort")

	// A good rollout is promoted after its shadow period.
	require.NoError(t, chromedp.Do(b, ro.propose(e, rolloutV1+"  - {id: ips, tier: ip, limit: 100000, period: 1s}\n", "INC-78 an IP ceiling")))
	ro.waitState(t, 3, events.RulesStateEnforced)
	require.Eventually(t, func() bool { return ro.replica.Rules().Version == 3 }, 10*time.Second, 50*time.Millisecond, "the replica enforces version 3")
	require.NoError(t, chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/sre/rollouts"), chromedp.WaitVisible(chromedp.ID("enforced-version")), shot("console-rollout-promoted")))
	enforced := textOf(t, b, "#enforced")
	require.Contains(t, enforced, "Version 3")
	require.Contains(t, enforced, "Watched until")
	require.True(t, strings.Contains(textOf(t, b, "#rollout-audit"), "rules.promote"))
}

// TestBrowserRolloutStep drives a gradual rollout in headless Chromium on
// the real stack: an SRE starts a good rollout in steps of 50 % and 100 %
// (the what-if first gate runs, and its verdict is shown); after its shadow
// period the controller takes it to its first step by itself, and the page
// shows the step in progress — the step list, the slice enforced, the
// classes judged since the step began with their confidence, the decisions
// the candidate answered, the recent window — and the step audited by the
// controller with its figures; the SRE then rolls it back at its step.
func TestBrowserRolloutStep(t *testing.T) {
	bin, shots := browserSetup(t)
	ro := newRolloutRig(t)
	ro.whatIf = "10m" // the first gate runs (on a decisions topic with nothing recorded)
	e := newEnvWith(t, func(cfg *Config, prefix string) { ro.configure(cfg, prefix) })
	ro.start(t, e)
	b := startBrowser(t, bin)

	good := rolloutV1 + "  - {id: ips, tier: ip, limit: 100000, period: 1s}\n"
	require.NoError(t, chromedp.Do(b, signIn(e.srv.URL, "sre1"), ro.propose(e, good, "INC-79 an IP ceiling, in steps", "50,100")))
	require.Contains(t, textOf(t, b, "#candidate-gate"), "what-if over the last 10m: review, confidence low, 0 decisions replayed")

	// The controller takes it to step 1 after the shadow period, by itself.
	require.Eventually(t, func() bool {
		st, err := ro.topic.Read(context.Background())
		if err != nil {
			return false
		}
		c, ok := st.Candidate()
		return ok && c.Version == 2 && c.Step == 1
	}, 30*time.Second, 100*time.Millisecond, "version 2 at step 1")
	ro.waitAudit(t, 2, rollout.ActionStep)
	// The replica has counted the step's decisions: a judged class is shown.
	require.Eventually(t, func() bool {
		if err := chromedp.Do(b, chromedp.Navigate(e.srv.URL+"/sre/rollouts"), chromedp.WaitVisible(chromedp.ID("candidate-steps"))); err != nil {
			return false
		}
		n, err := chromedp.Run(b, chromedp.Evaluate[int](`document.querySelectorAll('#step-classes tr[data-verdict="safe"]').length`))
		return err == nil && n > 0
	}, 30*time.Second, 500*time.Millisecond, "the step's classes judged safe on the page")
	require.NoError(t, chromedp.Do(b, screenshot(shots, "console-rollout-step")))
	require.Contains(t, textOf(t, b, "#candidate-version"), "Version 2 at step 1 of 2 (50 %)")
	require.Equal(t, "50.0 %", textOf(t, b, "#candidate-slice"))
	steps := textOf(t, b, "#candidate-steps")
	require.Contains(t, steps, "Step 1: 50 % of principals — in progress")
	require.Contains(t, steps, "Step 2: 100 % of principals")
	require.NotEmpty(t, textOf(t, b, "#step-ends"))
	require.Regexp(t, `^\d+\.\d %$`, textOf(t, b, "#step-confidence"))
	require.Contains(t, textOf(t, b, "#step-classes"), "priority=critical")
	require.Contains(t, textOf(t, b, "#slice-classes"), "kind=bot", "the decisions the candidate answered for its slice")
	require.Contains(t, textOf(t, b, "#candidate-classes"), "Last 5m0s")
	audit := textOf(t, b, "#rollout-audit")
	require.Contains(t, audit, "rules.step")
	require.Contains(t, audit, "step 1 of 2: enforced for 50 % of principals")
	hist, err := ro.audit.History(context.Background(), 5)
	require.NoError(t, err)
	require.Equal(t, rollout.ActionStep, hist[0].Action)
	require.EqualValues(t, 1, hist[0].After["candidate_step"], "the audit row's after: the step")
	require.NotNil(t, hist[0].After["figures"], "and the figures it was taken on")

	// The SRE rolls it back at its step.
	require.NoError(t, chromedp.Do(b,
		chromedp.SendKeys(chromedp.ID("srb-reason"), "INC-79 not today"),
		chromedp.Submit(chromedp.ID("srb-reason")),
		chromedp.WaitVisible(chromedp.ID("versions")),
	))
	ro.waitState(t, 2, events.RulesStateRolledBack)
	ro.waitAudit(t, 2, rollout.ActionRollback)
	require.Contains(t, textOf(t, b, "#candidate"), "No rollout in progress.")
}
