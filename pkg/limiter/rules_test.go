package limiter

import (
	"context"
	"encoding/json"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

const (
	shippedRules = "../../services/limiter/internal/app/rate-limits.yaml"
	e2eRules     = "../../services/limiter/testdata/e2e-rules.yaml"
	rulesSchema  = "../../schemas/rate-limits.schema.json"
)

func compileRulesSchema(t *testing.T) *jsonschema.Schema {
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	s, err := c.Compile(rulesSchema)
	require.NoError(t, err)
	return s
}

func schemaValidate(t *testing.T, s *jsonschema.Schema, data []byte) error {
	var doc any
	require.NoError(t, yaml.Unmarshal(data, &doc))
	// Round trip through JSON so YAML's ints become the json.Number the validator expects.
	raw, err := jsonschema.UnmarshalJSON(strings.NewReader(mustJSONString(t, doc)))
	require.NoError(t, err)
	return s.Validate(raw)
}

func TestShippedRulesParseAndMatchTheSchema(t *testing.T) {
	schema := compileRulesSchema(t)
	for _, path := range []string{shippedRules, e2eRules} {
		t.Run(filepath.Base(path), func(t *testing.T) {
			rs, data, err := LoadRulesFile(path)
			require.NoError(t, err)
			require.NoError(t, schemaValidate(t, schema, data))
			require.NotEmpty(t, rs.Rules)
		})
	}
	rs, _, err := LoadRulesFile(shippedRules)
	require.NoError(t, err)
	// The Discord-style grid.
	cases := []struct {
		id     string
		tier   events.Tier
		limit  int
		period time.Duration
	}{
		{"channel-messages", events.TierResource, 5, 5 * time.Second},
		{"channel-create", events.TierEndpoint, 5, time.Hour},
		{"member-update", events.TierResource, 10, 10 * time.Second},
		{"webhook-execute", events.TierResource, 30, time.Minute},
		{"bot-global", events.TierPrincipal, 50, time.Second},
		{"anonymous-per-ip", events.TierIP, 1000, time.Minute},
	}
	for _, tc := range cases {
		r := rs.Rule(tc.id)
		require.NotNil(t, r, tc.id)
		require.Equal(t, tc.tier, r.Tier, tc.id)
		require.Equal(t, tc.limit, r.Limit, tc.id)
		require.Equal(t, tc.period, r.Period, tc.id)
	}
	q := rs.Quota(events.PrincipalBot, "anything")
	require.NotNil(t, q, "unknown plans fall back to the default plan's quota")
	require.Equal(t, int64(86400), q.Limit)
	require.Nil(t, rs.Quota(events.PrincipalUser, DefaultPlan))
	require.True(t, rs.Rule("channel-messages").Matches(events.PrincipalBot, DefaultPlan, "POST", "/channels/{channel_id}/messages", "channel"))
	require.False(t, rs.Rule("anonymous-per-ip").Matches(events.PrincipalBot, DefaultPlan, "GET", "/x", ""))
}

// rejected is a rules file ParseRules must reject.
type rejected struct {
	name   string
	yaml   string
	want   string // substring of the error, with file:line
	schema bool   // the JSON Schema rejects it too
}

// requireRejected checks that ParseRules rejects every case with its error
// and, where the case says so, that the JSON Schema rejects it too.
func requireRejected(t *testing.T, cases []rejected) {
	t.Helper()
	schema := compileRulesSchema(t)
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseRules("test.yaml", []byte(tc.yaml))
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
			if tc.schema {
				require.Error(t, schemaValidate(t, schema, []byte(tc.yaml)), "the JSON Schema accepts it")
			}
		})
	}
}

func TestParseRulesRejectsWithFileAndLine(t *testing.T) {
	requireRejected(t, []rejected{
		{"not yaml", "version: 1\nrules: [\n", "test.yaml:2: did not find expected node content", false},
		{"wrong version", "version: 2\nrules:\n  - {id: a, tier: ip, limit: 1, period: 1s}\n", "test.yaml:1: version: must be 1", true},
		{"unknown key", "version: 1\nrules:\n  - id: a\n    tier: ip\n    limt: 1\n    period: 1s\n", `test.yaml:5: rules: unknown key "limt"`, true},
		{"unknown top key", "version: 1\nrule: []\n", `test.yaml:2: top level: unknown key "rule"`, true},
		{"bad tier", "version: 1\nrules:\n  - id: a\n    tier: planet\n    limit: 1\n    period: 1s\n", `test.yaml:4: rules[0] (a).tier: "planet"`, true},
		{"zero limit", "version: 1\nrules:\n  - id: a\n    tier: ip\n    limit: 0\n    period: 1s\n", "test.yaml:5: rules[0] (a).limit: 0: must be in", true},
		{"bad period", "version: 1\nrules:\n  - id: a\n    tier: ip\n    limit: 1\n    period: 5 seconds\n", "test.yaml:6: rules[0] (a).period", true},
		{"missing period", "version: 1\nrules:\n  - id: a\n    tier: ip\n    limit: 1\n", "test.yaml:3: rules[0] (a).period: required", true},
		{"endpoint without route", "version: 1\nrules:\n  - id: a\n    tier: endpoint\n    method: GET\n    limit: 1\n    period: 1s\n", "rules[0] (a).route", true},
		{"principal with route", "version: 1\nrules:\n  - id: a\n    tier: principal\n    route: /x\n    limit: 1\n    period: 1s\n", "test.yaml:3: rules[0] (a): tier principal applies to every route", true},
		{"raw path, not a template", "version: 1\nrules:\n  - id: a\n    tier: endpoint\n    method: GET\n    route: /a?b=1\n    limit: 1\n    period: 1s\n", "test.yaml:6: rules[0] (a).route", true},
		{"duplicate id", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 1, period: 1s}\n  - {id: a, tier: ip, limit: 1, period: 1s}\n", `test.yaml:4: rules[1].id: "a" is already the id of the rule at line 3`, false},
		{"burst below limit", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, burst: 2, period: 1s}\n", "test.yaml:3: rules[0] (a).burst: 2: must be at least the limit 5", false},
		{"burst on a window", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, burst: 9, period: 1s, algorithm: fixed_window}\n", "rules[0] (a).burst: fixed_window has no burst", true},
		{"burst on a log", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, burst: 9, period: 1s, algorithm: sliding_window_log}\n", "rules[0] (a).burst: sliding_window_log has no burst", true},
		{"log limit past its memory bound", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 10001, period: 1s, algorithm: sliding_window_log}\n", "test.yaml:3: rules[0] (a).limit: 10001: sliding_window_log keeps one entry per unit; must be at most 10000", true},
		{"log limit past its bound via defaults", "version: 1\ndefaults:\n  algorithm: sliding_window_log\nrules:\n  - {id: a, tier: ip, limit: 10001, period: 1s}\n", "rules[0] (a).limit: 10001: sliding_window_log", false},
		{"lease on a window", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, lease: 2, period: 1s, algorithm: fixed_window}\n", "test.yaml:3: rules[0] (a).lease: fixed_window cannot lease", true},
		{"lease past the capacity", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, burst: 8, lease: 9, period: 1s}\n", "rules[0] (a).lease: 9: must be in 1..8", false},
		{"lease of nothing", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, lease: -1, period: 1s}\n", "rules[0] (a).lease: -1: must be in 1..5", true},
		{"lease in shadow", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, lease: 2, shadow: true, period: 1s}\n", "rules[0] (a).lease: a shadow rule cannot lease", false},
		{"bad algorithm", "version: 1\nrules:\n  - {id: a, tier: ip, limit: 5, period: 1s, algorithm: magic}\n", `rules[0] (a).algorithm: "magic"`, true},
		{"bad fail policy", "version: 1\ndefaults:\n  fail: maybe\nrules:\n  - {id: a, tier: ip, limit: 5, period: 1s}\n", `test.yaml:3: defaults.fail: "maybe"`, true},
		{"bad kind", "version: 1\nrules:\n  - {id: a, tier: ip, kinds: [robot], limit: 5, period: 1s}\n", `rules[0] (a).kinds[0]: "robot"`, true},
		{"duplicate quota", "version: 1\nquotas:\n  - {kind: bot, limit: 5}\n  - {kind: bot, plan: default, limit: 6}\n", "test.yaml:4: quotas[1]: kind bot plan default already has the quota at line 3", false},
		{"nothing to enforce", "version: 1\n", "at least one rule or quota", true},
		{"wrong type", "version: 1\nrules:\n  - {id: a, tier: ip, limit: lots, period: 1s}\n", "test.yaml:3: cannot unmarshal", true},
	})
	t.Run("every problem is reported at once", func(t *testing.T) {
		_, err := ParseRules("test.yaml", []byte("version: 1\nrules:\n  - {id: a, tier: ip, limit: 0, period: 1s}\n  - {id: b, tier: ip, limit: 1, period: x}\n"))
		require.ErrorContains(t, err, "test.yaml:3:")
		require.ErrorContains(t, err, "test.yaml:4:")
	})
}

func TestEveryAlgorithmNameValidates(t *testing.T) {
	schema := compileRulesSchema(t)
	cases := []struct {
		name string
		alg  Algorithm
		code string
	}{
		{"token bucket", TokenBucket, "tb"},
		{"gcra", GCRA, "gcra"},
		{"fixed window", FixedWindow, "fw"},
		{"sliding window counter", SlidingWindow, "sw"},
		{"leaky bucket", LeakyBucket, "lb"},
		{"sliding window log", SlidingLog, "swl"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.code, tc.alg.code())
			require.Contains(t, strings.Split(algorithms, "|"), string(tc.alg), "named in the loader's error message")
			for _, doc := range []string{
				"version: 1\nrules:\n  - {id: a, tier: principal, limit: 10000, period: 1m, algorithm: " + string(tc.alg) + "}\n",
				"version: 1\ndefaults:\n  algorithm: " + string(tc.alg) + "\nrules:\n  - {id: a, tier: principal, limit: 10000, period: 1m}\n",
			} {
				rs, err := ParseRules("test.yaml", []byte(doc))
				require.NoError(t, err)
				require.Equal(t, tc.alg, rs.Rule("a").Algorithm)
				require.NoError(t, schemaValidate(t, schema, []byte(doc)), "the JSON Schema accepts %s", tc.alg)
			}
		})
	}
	t.Run("the schema enum lists exactly the loader's algorithms", func(t *testing.T) {
		raw, err := os.ReadFile(rulesSchema)
		require.NoError(t, err)
		var doc struct {
			Defs struct {
				Algorithm struct {
					Enum []string `json:"enum"`
				} `json:"algorithm"`
			} `json:"$defs"`
		}
		require.NoError(t, json.Unmarshal(raw, &doc))
		require.ElementsMatch(t, strings.Split(algorithms, "|"), doc.Defs.Algorithm.Enum)
	})
}

func TestReloaderAppliesValidRulesAndKeepsOldOnesOnError(t *testing.T) {
	dir := t.TempDir()
	path := filepath.Join(dir, "rate-limits.yaml")
	v1 := "version: 1\nrules:\n  - {id: a, tier: principal, limit: 1, period: 1s}\n"
	require.NoError(t, os.WriteFile(path, []byte(v1), 0o600))
	rs, data, err := LoadRulesFile(path)
	require.NoError(t, err)
	store := NewRuleStore(rs)
	hup := make(chan os.Signal, 1)
	r := NewReloader(path, data, store, 10*time.Millisecond, hup, slog.New(slog.DiscardHandler), prometheus.NewRegistry())
	applied := make(chan error, 10)
	r.Applied = func(err error) { applied <- err }
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() { done <- r.Run(ctx) }()
	t.Cleanup(func() { cancel(); <-done })
	// Replace the file the way ConfigMaps and editors do (write, then rename),
	// so a poll never reads it half written.
	write := func(content string) {
		tmp := path + ".tmp"
		require.NoError(t, os.WriteFile(tmp, []byte(content), 0o600))
		require.NoError(t, os.Rename(tmp, path))
	}
	wait := func() error {
		select {
		case err := <-applied:
			return err
		case <-time.After(10 * time.Second):
			t.Fatal("no reload")
			return nil
		}
	}

	write(strings.Replace(v1, "limit: 1", "limit: 7", 1))
	require.NoError(t, wait(), "a valid change is applied")
	require.Equal(t, 7, store.Rules().Rule("a").Limit)

	write("version: 1\nrules:\n  - {id: a, tier: principal, limit: -1, period: 1s}\n")
	err = wait()
	require.ErrorContains(t, err, path+":3:", "the rejection names file and line")
	require.Equal(t, 7, store.Rules().Rule("a").Limit, "invalid rules leave the old ones in force")

	write(strings.Replace(v1, "limit: 1", "limit: 9", 1))
	require.NoError(t, wait())
	require.Equal(t, 9, store.Rules().Rule("a").Limit)

	// SIGHUP re-reads even an unchanged file.
	hup <- syscall.SIGHUP
	require.NoError(t, wait())
	require.Equal(t, 9, store.Rules().Rule("a").Limit)

	require.NoError(t, os.Remove(path))
	require.ErrorContains(t, wait(), "read rules", "a vanished file is an error, and the rules stay")
	require.Equal(t, 9, store.Rules().Rule("a").Limit)
}

func mustJSONString(t *testing.T, v any) string {
	b, err := json.Marshal(v)
	require.NoError(t, err)
	return string(b)
}
