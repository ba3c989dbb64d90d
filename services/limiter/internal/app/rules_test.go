package app

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/rollout/rollouttest"
	"github.com/floodgate-dev/floodgate/pkg/service"
)

// cli runs one limiter subcommand with vars and returns its output.
func cli(t *testing.T, vars map[string]string, args ...string) (string, error) {
	t.Helper()
	var out bytes.Buffer
	env := service.NewEnv("limiter", service.Stdio{Args: args, Getenv: func(k string) string { return vars[k] }, Stdout: &out, Stderr: &out},
		slog.New(slog.DiscardHandler))
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	err := Run(ctx, env)
	return out.String(), err
}

// squash turns runs of spaces (tabwriter's padding) into one.
func squash(s string) string { return regexp.MustCompile(` +`).ReplaceAllString(s, " ") }

func writeFile(t *testing.T, name, body string) string {
	t.Helper()
	p := filepath.Join(t.TempDir(), name)
	require.NoError(t, os.WriteFile(p, []byte(body), 0o600))
	return p
}

func TestValidateCommand(t *testing.T) {
	good := writeFile(t, "good.yaml", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 10, period: 1s}\n")
	out, err := cli(t, nil, "validate", good)
	require.NoError(t, err)
	require.Contains(t, out, "valid: 1 rules, 0 quotas")
	bad := writeFile(t, "bad.yaml", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 0, period: 1s}\n")
	_, err = cli(t, nil, "validate", bad)
	require.ErrorContains(t, err, "bad.yaml:3: rules[0] (p).limit: 0: must be in 1..1000000000")
	_, err = cli(t, nil, "frobnicate")
	require.ErrorContains(t, err, `unknown command "frobnicate"`)
}

// auditPrefix creates the migrations' DynamoDB tables under a unique prefix.
func auditPrefix(t *testing.T) (string, *rollout.DynamoAudit) {
	t.Helper()
	ddb, prefix := migrationstest.DynamoTables(t, "limcli")
	return prefix, &rollout.DynamoAudit{Client: ddb, Table: prefix + dynamo.TableAuditLog}
}

// TestRolloutCommands drives the command line against the real broker,
// Redis and DynamoDB Local: bootstrap, a rollout in shadow, its status with
// the diff, and a rollback — each audited with who and why.
func TestRolloutCommands(t *testing.T) {
	redistest.Client(t)
	brokers, topic := rollouttest.Topic(t)
	_, decisions := rollouttest.Topic(t) // the what-if gate's recorded traffic: none
	prefix, audit := auditPrefix(t)
	vars := map[string]string{"FLOODGATE_KAFKA_BROKERS": strings.Join(brokers, ","), "FLOODGATE_RULES_TOPIC": topic, "FLOODGATE_DECISIONS_TOPIC": decisions,
		"FLOODGATE_DYNAMODB_ENDPOINT":     config.NewEnv(os.Getenv).String("FLOODGATE_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000"),
		"FLOODGATE_DYNAMODB_TABLE_PREFIX": prefix, "USER": "alice"}
	v1 := writeFile(t, "v1.yaml", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 100, period: 1s}\n")
	v2 := writeFile(t, "v2.yaml", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 50, period: 1s}\n")

	_, err := cli(t, vars, "rollout", v2, "-reason", "halve")
	require.ErrorIs(t, err, rollout.ErrNoEnforced)
	_, err = cli(t, vars, "rollout", v1, "-bootstrap")
	require.ErrorContains(t, err, "-reason is required")
	out, err := cli(t, vars, "rollout", v1, "-bootstrap", "-reason", "first version")
	require.NoError(t, err)
	require.Contains(t, out, "rules.bootstrap: version 1")
	_, err = cli(t, vars, "rollout", v2, "-reason", "halve the limit", "-steps", "1,50", "-whatif", "0")
	require.ErrorContains(t, err, "the last step must be 100")
	out, err = cli(t, vars, "rollout", v2, "-reason", "halve the limit", "-shadow", "5m", "-max-critical-block", "2.5", "-steps", "5,100", "-step-window", "2m")
	require.NoError(t, err)
	require.Contains(t, out, "what-if over the last 10m: ", "the what-if verdict is the first gate")
	require.Contains(t, out, "0 decisions replayed")
	require.Contains(t, out, "rules.rollout: version 2")

	out, err = cli(t, vars, "status")
	require.NoError(t, err)
	require.Contains(t, out, "-  - {id: p, tier: principal, limit: 100, period: 1s}\n+  - {id: p, tier: principal, limit: 50, period: 1s}\n")
	out = squash(out)
	require.Contains(t, out, "enforced: version 1")
	require.Contains(t, out, "candidate: version 2, shadow since")
	require.Contains(t, out, "steps: 5,100 % of principals, each watched 2m0s")
	require.Contains(t, out, "first gate: what-if over the last 10m: ", "the first gate's verdict is kept on the record")
	require.Contains(t, out, "aborted above 2.5 % CRITICAL would-block")
	require.Contains(t, out, "critical: 0 of 0 would block")

	out, err = cli(t, vars, "rollback", "-reason", "changed my mind", "-as", "bob")
	require.NoError(t, err)
	require.Contains(t, out, "rules.abort: version 2")
	out, err = cli(t, vars, "status")
	require.NoError(t, err)
	out = squash(out)
	require.Contains(t, out, "candidate: none")
	require.Contains(t, out, "2 rolled_back")

	hist, err := audit.History(context.Background(), 10)
	require.NoError(t, err)
	require.Len(t, hist, 3)
	require.Equal(t, "bob", hist[0].Actor)
	require.Equal(t, "changed my mind", hist[0].Reason)
	require.Equal(t, "cli", hist[0].Via)
	require.Equal(t, rollout.ActionAbort, hist[0].Action)
	require.Equal(t, "alice", hist[2].Actor)

	// A limiter on the topic serves version 1 and says so.
	st, err := rollout.NewTopic(brokers, nil, topic, nil).Read(context.Background())
	require.NoError(t, err)
	e, _ := st.Enforced()
	require.Equal(t, events.RulesStateEnforced, e.State)
	require.EqualValues(t, 1, e.Version)
}

func TestRulesTopicConfig(t *testing.T) {
	_, err := ConfigFromEnv(func(k string) string {
		return map[string]string{"FLOODGATE_RULES_TOPIC": "bad topic!"}[k]
	})
	require.ErrorContains(t, err, "FLOODGATE_RULES_TOPIC")
	c, err := ConfigFromEnv(func(k string) string {
		return map[string]string{"FLOODGATE_RULES_TOPIC": "floodgate.rules.v1"}[k]
	})
	require.NoError(t, err)
	require.Equal(t, "floodgate.rules.v1", c.RulesTopic)
}
