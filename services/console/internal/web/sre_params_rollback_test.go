package web

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/url"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
)

// TestParamsRollbackByHand: an SRE stops a detector parameters rollout
// from the console's API — the candidate in shadow is aborted, a candidate
// at a step is rolled back, an enforced version with a parent is restored
// to it — each audited under detector-params#rollout as params.abort or
// params.rollback with the SRE's name, role and reason. An analyst is
// refused (403), a missing reason is refused (422), and with nothing to
// stop or undo the answer is 409.
func TestParamsRollbackByHand(t *testing.T) {
	brokers, name := rollouttest.Topic(t)
	topic := rollout.NewTopic(brokers, nil, name, nil)
	t.Cleanup(func() { _ = topic.Close() })
	var audit *rollout.DynamoAudit
	e := newEnvWith(t, func(cfg *Config, prefix string) {
		audit = &rollout.DynamoAudit{Table: prefix + dynamo.TableAuditLog, Subject: rollout.ParamsAuditSubject}
		cfg.Proposals = &Proposals{Table: prefix + dynamo.TableRuntimeConfig, Audit: audit,
			Operator: &rollout.Operator{Topic: topic, Audit: audit, Validate: ValidateParams}}
	})
	audit.Client, e.web.cfg.Proposals.DDB = e.ddb, e.ddb
	op := e.web.cfg.Proposals.Operator
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	sre := rollout.Actor{Name: "sre-cli", Role: "sre", Reason: "set up", Via: "cli"}
	_, err := op.Bootstrap(ctx, "defaults: {}\n", sre)
	require.NoError(t, err)
	propose := func(doc string) int64 {
		t.Helper()
		p, err := op.Propose(ctx, doc, rollout.DefaultParams(), sre)
		require.NoError(t, err)
		return p.Version
	}

	post := func(role, contentType, body string) (int, map[string]any) {
		t.Helper()
		req, err := http.NewRequest(http.MethodPost, e.srv.URL+"/api/v1/proposals/rollback", strings.NewReader(body))
		require.NoError(t, err)
		req.Header.Set("Content-Type", contentType)
		req.Header.Set("Authorization", "Bearer "+e.tokens[role])
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		b, err := io.ReadAll(res.Body)
		require.NoError(t, err)
		out := map[string]any{}
		_ = json.Unmarshal(b, &out)
		return res.StatusCode, out
	}
	form := func(reason string) string { return url.Values{"reason": {reason}}.Encode() }
	const formType = "application/x-www-form-urlencoded"
	last := func() rollout.AuditEntry {
		t.Helper()
		rows, err := audit.History(ctx, 1)
		require.NoError(t, err)
		require.Len(t, rows, 1)
		return rows[0]
	}

	// In shadow: aborted.
	v2 := propose("overrides:\n    - kind: user\n      person_sustain: 5s\n")
	code, _ := post("analyst", formType, form("not mine to stop"))
	require.Equal(t, http.StatusForbidden, code, "role sre only")
	code, _ = post("sre", "application/json", `{"reason":"  "}`)
	require.Equal(t, http.StatusUnprocessableEntity, code, "a reason is required")
	code, body := post("sre", "application/json", `{"reason":"INC-91: penalized people in shadow"}`)
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, map[string]any{"ok": true, "action": rollout.ParamsActionAbort, "version": float64(v2)}, body)
	st, err := topic.Read(ctx)
	require.NoError(t, err)
	_, ok := st.Candidate()
	require.False(t, ok, "the candidate is withdrawn")
	v, _ := st.Version(v2)
	require.Equal(t, events.RulesStateRolledBack, v.State)
	row := last()
	require.Equal(t, rollout.ParamsActionAbort, row.Action)
	require.Equal(t, "sre-bot", row.Actor)
	require.Equal(t, "sre", row.Role)
	require.Equal(t, "console", row.Via)
	require.Equal(t, "INC-91: penalized people in shadow", row.Reason)
	require.EqualValues(t, v2, row.Version)

	// Nothing to stop: version 1 has no parent.
	code, _ = post("sre", formType, form("again"))
	require.Equal(t, http.StatusConflict, code)

	// At a step: rolled back at the step.
	v3 := propose("overrides:\n    - kind: user\n      person_sustain: 4s\n")
	_, err = op.Apply(ctx, sre, func(st *rollout.State) (rollout.Plan, error) { return rollout.PlanStep(st, v3, sre, time.Now()) })
	require.NoError(t, err)
	code, body = post("sre", formType, form("INC-92"))
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, rollout.ParamsActionRollback, body["action"])
	require.EqualValues(t, v3, body["version"])
	require.Equal(t, rollout.ParamsActionRollback, last().Action)
	st, err = topic.Read(ctx)
	require.NoError(t, err)
	_, ok = st.Candidate()
	require.False(t, ok)
	enf, _ := st.Enforced()
	require.EqualValues(t, 1, enf.Version, "the parent answers everybody")

	// Enforced with a parent: restored.
	v4 := propose("overrides:\n    - kind: user\n      person_sustain: 3s\n")
	_, err = op.Promote(ctx, sre)
	require.NoError(t, err)
	code, body = post("sre", formType, form("INC-93"))
	require.Equal(t, http.StatusOK, code, "%v", body)
	require.Equal(t, rollout.ParamsActionRollback, body["action"])
	require.EqualValues(t, v4, body["version"])
	st, err = topic.Read(ctx)
	require.NoError(t, err)
	enf, _ = st.Enforced()
	require.EqualValues(t, 1, enf.Version, "version 1 enforced again")
	require.Equal(t, "defaults: {}\n", enf.Rules)
}
