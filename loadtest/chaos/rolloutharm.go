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
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	prefix, err := e.Tables(ctx)
	if err != nil {
		return err
	}
	const topicName = "floodgate.rules.v1"
	topic := rollout.NewTopic([]string{b.Addr}, nil, topicName, e.Log)
	defer topic.Close()
	table := prefix + dynamo.TableAuditLog
	audit := &rollout.DynamoAudit{Client: e.DB(), Table: table}
	op := &rollout.Operator{Topic: topic, Audit: audit, Claims: &rollout.DynamoClaims{Client: e.DB(), Table: table},
		Validate: func(name string, b []byte) error { _, err := limiter.ParseRules(name, b); return err }}
	sre := rollout.Actor{Name: "chaos", Reason: "rollout-class-harm", Via: "cli"}
	if _, err := op.Bootstrap(ctx, harmParent, sre); err != nil {
		return fmt.Errorf("bootstrap rules: %w", err)
	}
	lim, err := e.StartLimiter(ctx, b, rd, "", "FLOODGATE_RULES_TOPIC="+topicName, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT=")
	if err != nil {
		return err
	}
	if _, err := e.startService(ctx, "adjuster", []string{
		"FLOODGATE_REDIS_ADDRS=" + rd.Addr, "FLOODGATE_KAFKA_BROKERS=" + b.Addr,
		"FLOODGATE_DYNAMODB_ENDPOINT=" + e.DynamoEndpoint, "FLOODGATE_DYNAMODB_TABLE_PREFIX=" + prefix,
		"FLOODGATE_INFLUX_URL=" + closedURL(), "FLOODGATE_RULES_TOPIC=" + topicName, "FLOODGATE_ADJUSTER_ROLLOUT_WINDOW=30s",
	}); err != nil {
		return err
	}
	people, bots := users("harm", 50), make([]events.Principal, 50)
	for i := range bots {
		bots[i] = events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("harmbot%d_%d", time.Now().UnixNano(), i)}
	}
	load := &Load{URL: "http://" + lim.Addr, Rate: 200, Workers: 8,
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
	if _, err := op.Propose(ctx, harmCandidate, params, sre); err != nil {
		return fmt.Errorf("propose the candidate: %w", err)
	}
	var final rollout.Entry
	err = waitFor(ctx, 90*time.Second, "the controller aborts the candidate", func() error {
		st, err := topic.Read(ctx)
		if err != nil {
			return err
		}
		for _, v := range st.Versions() {
			if v.Version == 2 && v.State != events.RulesStateShadow {
				final = v
				return nil
			}
		}
		return fmt.Errorf("version 2 still in shadow")
	})
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
	hist, err := audit.History(ctx, 10)
	if err != nil {
		return fmt.Errorf("read the rollout audit: %w", err)
	}
	var abortRow *rollout.AuditEntry
	for i := range hist {
		if hist[i].Action == rollout.ActionAbort {
			abortRow = &hist[i]
			break
		}
	}
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
