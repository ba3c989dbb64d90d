package rollout_test

import (
	"context"
	"errors"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
)

// auditTable creates the migrations' audit table under a unique prefix on
// DynamoDB Local and returns the audit log's writer.
func auditTable(t *testing.T) *rollout.DynamoAudit {
	t.Helper()
	ddb, prefix := migrationstest.DynamoTables(t, "rollout", dynamo.TableAuditLog)
	return &rollout.DynamoAudit{Client: ddb, Table: prefix + dynamo.TableAuditLog}
}

// TestTopicAndAudit: operations land on the real broker in order, a reader
// that starts later and a follower see the same state, and every step is in
// the audit log with who, how and why.
func TestTopicAndAudit(t *testing.T) {
	topic, _ := rollouttest.OpenTopic(t)
	audit := auditTable(t)
	valid := func(_ string, b []byte) error {
		if !strings.HasPrefix(string(b), "version: 1") {
			return errors.New("not a rules file")
		}
		return nil
	}
	op := &rollout.Operator{Topic: topic, Audit: audit, Validate: valid}
	ctx := context.Background()

	var mu sync.Mutex
	var seen []rollout.State
	fctx, stop := context.WithCancel(ctx)
	done := make(chan error, 1)
	go func() {
		done <- topic.Follow(fctx, rollout.State{}, func(s rollout.State) { mu.Lock(); seen = append(seen, s); mu.Unlock() })
	}()

	alice := rollout.Actor{Name: "alice", Role: "sre", Reason: "first rules", Via: "cli"}
	_, err := op.Bootstrap(ctx, "version: 1 # a", alice)
	require.NoError(t, err)
	_, err = op.Propose(ctx, "not yaml", rollout.DefaultParams(), alice)
	require.ErrorContains(t, err, "not a rules file", "nothing invalid is published")
	alice.Reason = "tighter bots"
	_, err = op.Propose(ctx, "version: 1 # b", rollout.DefaultParams(), alice)
	require.NoError(t, err)
	bob := rollout.Actor{Name: "bob", Role: "sre", Reason: "looks wrong", Via: "console"}
	p, err := op.Rollback(ctx, bob)
	require.NoError(t, err)
	require.Equal(t, rollout.ActionAbort, p.Action)

	st, err := topic.Read(ctx)
	require.NoError(t, err)
	e, ok := st.Enforced()
	require.True(t, ok)
	require.EqualValues(t, 1, e.Version)
	require.Equal(t, "version: 1 # a", e.Rules)
	v2, _ := st.Version(2)
	require.Equal(t, events.RulesStateRolledBack, v2.State)
	require.Equal(t, "bob", v2.Author)
	require.Equal(t, "looks wrong", v2.Reason)
	require.EqualValues(t, 3, st.Next(), "three records")

	require.Eventually(t, func() bool {
		mu.Lock()
		defer mu.Unlock()
		return len(seen) > 0 && seen[len(seen)-1].Next() == 3
	}, 10*time.Second, 20*time.Millisecond, "the follower catches up")
	stop()
	require.NoError(t, <-done)

	hist, err := audit.History(ctx, 10)
	require.NoError(t, err)
	require.Len(t, hist, 3)
	require.Equal(t, rollout.ActionAbort, hist[0].Action)
	require.Equal(t, "bob", hist[0].Actor)
	require.Equal(t, "console", hist[0].Via)
	require.Equal(t, "looks wrong", hist[0].Reason)
	require.EqualValues(t, 2, hist[0].Version)
	require.EqualValues(t, 2, hist[0].Before["candidate"])
	require.NotContains(t, hist[0].After, "candidate")
	require.Equal(t, rollout.ActionPropose, hist[1].Action)
	require.Equal(t, rollout.ActionBootstrap, hist[2].Action)
	require.Equal(t, "alice", hist[2].Actor)
}

// barrierClaims holds every Claim until n writers have reached it: each has
// read the topic and planned its change against the same state — the race of
// two operators starting a rollout at the same moment, made certain.
type barrierClaims struct {
	rollout.Claims
	arrived sync.WaitGroup
}

func (b *barrierClaims) Claim(ctx context.Context, topic string, next int64, holder string, lease time.Duration) error {
	b.arrived.Done()
	b.arrived.Wait()
	return b.Claims.Claim(ctx, topic, next, holder, lease)
}

// TestConcurrentStartsCannotShareAVersion: two operators start a rollout at
// once, both having read the same topic (next version 2). Exactly one is
// published; the other gets ErrConflict and nothing of its rules reaches the
// topic; asked again, it is refused because a rollout is in shadow. A claim
// whose writer died is taken over once its lease has passed.
func TestConcurrentStartsCannotShareAVersion(t *testing.T) {
	topic, name := rollouttest.OpenTopic(t)
	audit := auditTable(t)
	claims := &rollout.DynamoClaims{Client: audit.Client, Table: audit.Table}
	valid := func(string, []byte) error { return nil }
	ctx := context.Background()
	_, err := (&rollout.Operator{Topic: topic, Audit: audit, Claims: claims, Validate: valid}).
		Bootstrap(ctx, "version: 1 # v1", rollout.Actor{Name: "alice", Reason: "first", Via: "cli"})
	require.NoError(t, err)

	race := &barrierClaims{Claims: claims}
	race.arrived.Add(2)
	op := &rollout.Operator{Topic: topic, Audit: audit, Claims: race, Validate: valid}
	rules := []string{"version: 1 # alice", "version: 1 # bob"}
	errs := make([]error, 2)
	plans := make([]rollout.Plan, 2)
	var wg sync.WaitGroup
	for i, who := range []string{"alice", "bob"} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			plans[i], errs[i] = op.Propose(ctx, rules[i], rollout.DefaultParams(), rollout.Actor{Name: who, Reason: "INC-9", Via: "console"})
		}()
	}
	wg.Wait()
	won := -1
	for i, err := range errs {
		if err == nil {
			require.Equal(t, -1, won, "both operators published")
			won = i
			continue
		}
		require.ErrorIs(t, err, rollout.ErrConflict)
	}
	require.NotEqual(t, -1, won, "neither operator published: %v", errs)
	require.EqualValues(t, 2, plans[won].Version)

	st, err := topic.Read(ctx)
	require.NoError(t, err)
	require.EqualValues(t, 2, st.Next(), "the bootstrap and one rollout: nothing of the loser's")
	c, ok := st.Candidate()
	require.True(t, ok)
	require.EqualValues(t, 2, c.Version)
	require.Equal(t, rules[won], c.Rules)
	hist, err := audit.History(ctx, 10)
	require.NoError(t, err)
	require.Len(t, hist, 2, "one audit row for the bootstrap, one for the winner")

	loser := 1 - won
	_, err = (&rollout.Operator{Topic: topic, Audit: audit, Claims: claims, Validate: valid}).
		Propose(ctx, rules[loser], rollout.DefaultParams(), rollout.Actor{Name: "carol", Reason: "again", Via: "cli"})
	require.ErrorIs(t, err, rollout.ErrInProgress, "read again, the loser sees the winner's rollout")

	// A writer that claimed and died holds its offset for the lease only.
	now := time.Now()
	lease := &rollout.DynamoClaims{Client: audit.Client, Table: audit.Table, Now: func() time.Time { return now }}
	require.NoError(t, lease.Claim(ctx, name, 99, "dead", time.Minute))
	require.ErrorIs(t, lease.Claim(ctx, name, 99, "next", time.Minute), rollout.ErrConflict)
	require.NoError(t, lease.Release(ctx, name, 99, "next"), "releasing another holder's claim changes nothing")
	require.ErrorIs(t, lease.Claim(ctx, name, 99, "next", time.Minute), rollout.ErrConflict)
	now = now.Add(61 * time.Second)
	require.NoError(t, lease.Claim(ctx, name, 99, "next", time.Minute), "the dead writer's lease has passed")
}

// TestParamsRolloutsAuditedUnderTheirOwnActions: the same operations on a
// detector parameters topic, audited under ParamsAuditSubject, are written
// as params.* actions; the rules' audit, in the same table, keeps rules.*.
func TestParamsRolloutsAuditedUnderTheirOwnActions(t *testing.T) {
	rules := auditTable(t)
	params := &rollout.DynamoAudit{Client: rules.Client, Table: rules.Table, Subject: rollout.ParamsAuditSubject}
	ctx := context.Background()
	valid := func(string, []byte) error { return nil }
	for _, audit := range []*rollout.DynamoAudit{rules, params} {
		brokers, name := rollouttest.Topic(t)
		topic := rollout.NewTopic(brokers, nil, name, nil)
		t.Cleanup(func() { _ = topic.Close() })
		op := &rollout.Operator{Topic: topic, Audit: audit, Validate: valid}
		sre := rollout.Actor{Name: "sre1", Role: "sre", Reason: "a change", Via: "cli"}
		_, err := op.Bootstrap(ctx, "a", sre)
		require.NoError(t, err)
		_, err = op.Propose(ctx, "b", rollout.DefaultParams(), sre)
		require.NoError(t, err)
		_, err = op.Rollback(ctx, sre)
		require.NoError(t, err)
	}
	actions := func(a *rollout.DynamoAudit) []string {
		hist, err := a.History(ctx, 10)
		require.NoError(t, err)
		var out []string
		for _, h := range hist {
			out = append(out, h.Action)
		}
		return out
	}
	require.Equal(t, []string{rollout.ActionAbort, rollout.ActionPropose, rollout.ActionBootstrap}, actions(rules))
	require.Equal(t, []string{"params.abort", "params.rollout", "params.bootstrap"}, actions(params))
	require.Equal(t, rollout.ParamsActionStep, rollout.ParamsAction(rollout.ActionStep))
	require.Equal(t, rollout.ParamsActionRollback, rollout.ParamsAction(rollout.ActionRollback))
	require.Equal(t, rollout.ParamsActionPromote, rollout.ParamsAction(rollout.ActionPromote))
	require.Equal(t, "lift", rollout.ParamsAction("lift"), "not a rollout action")
}
