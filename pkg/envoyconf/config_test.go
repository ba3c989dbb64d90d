package envoyconf

import (
	"errors"
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/limiter"

	"github.com/stretchr/testify/require"
)

func mustLoad(t *testing.T) *Config {
	t.Helper()
	c, err := LoadDir("testdata", Options{})
	require.NoError(t, err)
	return c
}

func e(kv ...string) []Entry {
	var out []Entry
	for i := 0; i+1 < len(kv); i += 2 {
		out = append(out, Entry{kv[i], kv[i+1]})
	}
	return out
}

// TestLookupFollowsEnvoyRatelimit checks the matching rules of envoy
// ratelimit's documentation, example by example.
func TestLookupFollowsEnvoyRatelimit(t *testing.T) {
	c := mustLoad(t)
	require.Equal(t, []string{"edge_proxy_per_ip", "example", "messaging", "mongo_cps"}, c.Domains())
	cases := []struct {
		name    string
		domain  string
		entries []Entry
		rpu     uint32 // 0 with want false: no limit
		want    bool
	}{
		{"key and value", "mongo_cps", e("database", "users"), 500, true},
		{"value not configured", "mongo_cps", e("database", "other"), 0, false},
		{"nested key without value counts per value", "messaging", e("message_type", "marketing", "to_number", "2061111111"), 5, true},
		{"top-level key without value", "messaging", e("to_number", "2061111111"), 100, true},
		{"a descriptor longer than the tree matches nothing", "mongo_cps", e("database", "users", "x", "y"), 0, false},
		{"a descriptor shorter than the tree's limit matches nothing", "messaging", e("message_type", "marketing"), 0, false},
		{"most specific first: the blocked address", "edge_proxy_per_ip", e("remote_address", "50.0.0.5"), 0, true},
		{"any other address", "edge_proxy_per_ip", e("remote_address", "50.0.0.1"), 10, true},
		{"two levels", "example", e("key", "value", "subkey", "x"), 3, true},
		{"unknown domain", "nope", e("database", "users"), 0, false},
		{"trailing wildcard", "example", e("path", "/files/a.pdf"), 3, true},
		{"wildcard that does not match", "example", e("path", "/other/a.pdf"), 0, false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			m := c.Lookup(tc.domain, tc.entries)
			if !tc.want {
				require.Nil(t, m.Limit)
				return
			}
			require.NotNil(t, m.Limit)
			require.Equal(t, tc.rpu, m.Limit.RequestsPerUnit)
		})
	}
	require.True(t, c.Lookup("example", e("ldap", "x")).Limit.Unlimited)
	require.Equal(t, []string{"shared-*"}, c.Lookup("example", e("bucket", "shared-a")).CounterValues, "share_threshold counts every match on one counter")
	require.Equal(t, []string{"/files/a.pdf"}, c.Lookup("example", e("path", "/files/a.pdf")).CounterValues, "without it, one counter per value")
}

func TestWildcardMatch(t *testing.T) {
	for _, tc := range []struct {
		pattern, s string
		want       bool
	}{
		{"a*", "abc", true}, {"a*", "a", true}, {"a*", "ba", false},
		{"a*c", "abbc", true}, {"a*c", "ac", true}, {"a*c", "abcd", false},
		{"a*b*c", "a1b2c", true}, {"a*b*c", "ac", false}, {"*", "", true}, {"ab*ba", "aba", false},
	} {
		require.Equal(t, tc.want, wildcardMatch(splitStar(tc.pattern), tc.s), "%s ~ %s", tc.pattern, tc.s)
	}
}

func splitStar(s string) []string {
	var out []string
	start := 0
	for i := 0; i < len(s); i++ {
		if s[i] == '*' {
			out = append(out, s[start:i])
			start = i + 1
		}
	}
	return append(out, s[start:])
}

// TestLoadErrorsNameFileAndLine: every invalid configuration envoy ratelimit
// refuses is refused, with the file and line.
func TestLoadErrorsNameFileAndLine(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"empty domain", "domain: ''\ndescriptors: []\n", "f.yaml:1: config file cannot have empty domain"},
		{"empty key", "domain: d\ndescriptors:\n  - value: v\n", "f.yaml:3: descriptor has empty key"},
		{"duplicate key", "domain: d\ndescriptors:\n  - key: k\n  - key: k\n", `f.yaml:4: duplicate descriptor composite key "d.k"`},
		{"bad unit", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: fortnight\n      requests_per_unit: 1\n", `f.yaml:5: invalid rate limit unit "fortnight"`},
		{"unit with unlimited", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unlimited: true\n      unit: second\n", "f.yaml:6: should not specify rate limit unit when unlimited"},
		{"misspelled key", "domain: d\ndescriptors:\n  - key: k\n    ratelimit:\n      unit: second\n", `f.yaml:4: config error, unknown key "ratelimit"`},
		{"replaces itself", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      name: a\n      replaces: [{name: a}]\n      unit: second\n      requests_per_unit: 1\n", "replaces should not contain name of same descriptor"},
		{"empty replaces", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      replaces: [{name: ''}]\n      unit: second\n      requests_per_unit: 1\n", "should not have an empty replaces entry"},
		{"share without wildcard", "domain: d\ndescriptors:\n  - key: k\n    value: v\n    share_threshold: true\n", "share_threshold can only be used with wildcard values"},
		{"negative requests", "domain: d\ndescriptors:\n  - key: k\n    rate_limit:\n      unit: second\n      requests_per_unit: -1\n", "f.yaml:6: requests_per_unit must be a whole number"},
		{"not yaml", "domain: [\n", "f.yaml: yaml:"},
		{"list of non-maps", "domain: d\ndescriptors:\n  - k\n", "f.yaml:3: config error, yaml file contains list of type other than map"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]File{{Name: "f.yaml", Data: []byte(tc.yaml)}}, Options{})
			require.Error(t, err)
			require.True(t, errors.Is(err, ErrConfig))
			require.Contains(t, err.Error(), tc.want)
		})
	}
	_, err := Load([]File{{Name: "a.yaml", Data: []byte("domain: d\n")}, {Name: "b.yaml", Data: []byte("domain: d\n")}}, Options{})
	require.ErrorContains(t, err, `b.yaml:1: duplicate domain "d"`)
	_, err = Load([]File{{Name: "a.yaml", Data: []byte("domain: d\ndescriptors: [{key: a}]\n")}, {Name: "b.yaml", Data: []byte("domain: d\ndescriptors: [{key: b}]\n")}}, Options{MergeDomains: true})
	require.NoError(t, err, "MERGE_DOMAIN_CONFIG merges")
}

// TestLoadIsAsStrictAsEnvoyRatelimit: what envoy ratelimit's loader (the
// pinned build) refuses, Floodgate refuses, naming the file and line — so a
// file that loads here loads there. loadtest/envoypeer asks the peer's own
// checker about the same files.
func TestLoadIsAsStrictAsEnvoyRatelimit(t *testing.T) {
	cases := []struct {
		name, yaml, want string
	}{
		{"metadata, documented but not in the peer's validKeys", "domain: d\ndescriptors:\n  - key: k\n    metadata: {a: b}\n    rate_limit: {unit: second, requests_per_unit: 1}\n", `f.yaml:4: config error, unknown key "metadata": envoy ratelimit's loader refuses it`},
		{"a floodgate key", "domain: d\ndescriptors:\n  - key: k\n    floodgate: {algorithm: gcra}\n", `f.yaml:4: config error, unknown key "floodgate"`},
		{"a float value", "domain: d\ndescriptors:\n  - key: k\n    value: 1.5\n", `f.yaml:4: value must be a string, not the number 1.5`},
		{"a float key", "domain: d\ndescriptors:\n  - key: 2.0\n", `f.yaml:3: key must be a string, not the number 2.0`},
		{"a float domain", "domain: 1e3\n", `f.yaml:1: domain must be a string`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]File{{Name: "f.yaml", Data: []byte(tc.yaml)}}, Options{})
			require.ErrorIs(t, err, ErrConfig)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, err := Load([]File{{Name: "f.yaml", Data: []byte("domain: d\ndescriptors:\n  - key: k\n    value: 15\n  - key: b\n    value: true\n")}}, Options{})
	require.NoError(t, err, "integers and booleans are values, as in the peer")
}

// TestFloodgateCommentSelectsTheAlgorithm reads a limit's Floodgate options
// from its floodgate comment, wherever on the descriptor's own lines it is.
func TestFloodgateCommentSelectsTheAlgorithm(t *testing.T) {
	c, err := Load([]File{{Name: "f.yaml", Data: []byte(`domain: d
descriptors:
  - key: above
    # floodgate: {algorithm: gcra, burst: 20, fail: closed}
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: inline
    rate_limit: {unit: second, requests_per_unit: 10} # floodgate: {algorithm: sliding_window}
  - key: block # floodgate: {algorithm: token_bucket}
    rate_limit:
      unit: minute
      requests_per_unit: 10
  # floodgate: {fail: open}
  - key: item
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: plain
    # an ordinary comment
    rate_limit: {unit: second, requests_per_unit: 10}
  - key: parent
    descriptors:
      - key: child
        rate_limit: # floodgate: {algorithm: leaky_bucket, burst: 3}
          unit: hour
          requests_per_unit: 5
`)}}, Options{})
	require.NoError(t, err)
	ext := func(entries ...Entry) *Extension { return c.Lookup("d", entries).Limit.Ext }
	require.Equal(t, &Extension{Algorithm: limiter.GCRA, Burst: 20, Fail: FailClosed, Source: "f.yaml:4"}, ext(Entry{"above", "x"}))
	require.Equal(t, limiter.SlidingWindow, ext(Entry{"inline", "x"}).Algorithm)
	require.Equal(t, "f.yaml:7", ext(Entry{"inline", "x"}).Source)
	require.Equal(t, limiter.TokenBucket, ext(Entry{"block", "x"}).Algorithm)
	require.Equal(t, &Extension{Fail: FailOpen, Source: "f.yaml:12"}, ext(Entry{"item", "x"}))
	require.Nil(t, ext(Entry{"plain", "x"}))
	require.Equal(t, limiter.FixedWindow, c.Lookup("d", []Entry{{"plain", "x"}}).Limit.Algorithm())
	require.Equal(t, &Extension{Algorithm: limiter.LeakyBucket, Burst: 3, Source: "f.yaml:21"}, ext(Entry{"parent", "p"}, Entry{"child", "c"}))
}

// TestFloodgateCommentErrorsNameFileAndLine: a floodgate comment is
// validated like every key — a typo is an error at its line, never ignored.
func TestFloodgateCommentErrorsNameFileAndLine(t *testing.T) {
	const head = "domain: d\ndescriptors:\n  - key: k\n"
	const rl = "    rate_limit: {unit: second, requests_per_unit: 10}\n"
	cases := []struct {
		name, yaml, want string
	}{
		{"unknown algorithm", head + "    # floodgate: {algorithm: leaky}\n" + rl, `f.yaml:4: floodgate comment: algorithm "leaky": want one of fixed_window, token_bucket, gcra, sliding_window, leaky_bucket, sliding_window_log`},
		{"unknown option", head + "    # floodgate: {algo: gcra}\n" + rl, `f.yaml:4: floodgate comment: unknown option "algo" (allowed: algorithm, burst, fail)`},
		{"bad fail policy", head + "    # floodgate: {fail: local}\n" + rl, `f.yaml:4: floodgate comment: fail "local": want open or closed`},
		{"burst without a capacity", head + "    # floodgate: {algorithm: sliding_window, burst: 5}\n" + rl, `f.yaml:4: floodgate comment: burst needs an algorithm with a capacity`},
		{"zero burst", head + "    # floodgate: {algorithm: gcra, burst: 0}\n" + rl, `f.yaml:4: floodgate comment: burst must be at least 1`},
		{"not a mapping", head + "    # floodgate: gcra\n" + rl, `f.yaml:4: floodgate comment: want a YAML flow mapping`},
		{"no colon", head + "    # floodgate algorithm=gcra\n" + rl, "f.yaml:4: floodgate comment: want `# floodgate: {algorithm, burst, fail}`"},
		{"on a descriptor without a limit", head + "    # floodgate: {algorithm: gcra}\n    value: v\n", `f.yaml:4: floodgate comment: this descriptor has no rate_limit`},
		{"after the last line", head + rl + "    # floodgate: {algorithm: gcra}\n", `f.yaml:5: floodgate comment outside a descriptor`},
		{"unlimited", head + "    # floodgate: {algorithm: gcra}\n    rate_limit: {unlimited: true}\n", `f.yaml:4: floodgate comment: an unlimited rate_limit counts nothing`},
		{"sliding log past its bound", head + "    # floodgate: {algorithm: sliding_window_log}\n    rate_limit: {unit: hour, requests_per_unit: 20000}\n", `f.yaml:4: floodgate comment: sliding_window_log keeps one entry per request`},
		{"two comments", head + "    # floodgate: {algorithm: gcra}\n    rate_limit: {unit: second, requests_per_unit: 10} # floodgate: {fail: open}\n", `f.yaml:5: a second floodgate comment on this descriptor (the first is on line 4)`},
		{"outside a descriptor", "# floodgate: {algorithm: gcra}\n" + head + rl, `f.yaml:1: floodgate comment outside a descriptor`},
		{"above nested descriptors", head + rl + "    # floodgate: {algorithm: gcra}\n    descriptors:\n      - key: c\n        rate_limit: {unit: second, requests_per_unit: 1}\n", `f.yaml:5: floodgate comment outside a descriptor`},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Load([]File{{Name: "f.yaml", Data: []byte(tc.yaml)}}, Options{})
			require.ErrorIs(t, err, ErrConfig)
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// FuzzLoad: no file makes the loader panic, and what loads holds only
// valid floodgate options on counted limits.
func FuzzLoad(f *testing.F) {
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k\n    # floodgate: {algorithm: gcra, burst: 2, fail: open}\n    rate_limit: {unit: second, requests_per_unit: 1}\n"))
	f.Add([]byte("domain: d\ndescriptors:\n  - key: k # floodgate: {}\n    rate_limit: {unit: second, requests_per_unit: 1} # floodgate: {fail: closed}\n"))
	f.Add([]byte("# floodgate:\ndomain: d\n"))
	f.Fuzz(func(t *testing.T, data []byte) {
		c, err := Load([]File{{Name: "f.yaml", Data: data}}, Options{})
		if err != nil {
			if !errors.Is(err, ErrConfig) {
				t.Fatalf("error without ErrConfig: %v", err)
			}
			return
		}
		var walk func(n *node)
		walk = func(n *node) {
			if l := n.limit; l != nil && l.Ext != nil {
				if l.Unlimited && Floodgate(l.Ext.Algorithm) {
					t.Fatalf("an algorithm on an unlimited limit: %+v", l.Ext)
				}
				if l.Ext.Burst > 0 && !l.Ext.Algorithm.HasBurst() {
					t.Fatalf("a burst without a capacity: %+v", l.Ext)
				}
				if f := l.Ext.Fail; f != "" && f != FailOpen && f != FailClosed {
					t.Fatalf("fail policy %q", f)
				}
			}
			for _, ch := range n.children {
				walk(ch)
			}
		}
		for _, d := range c.domains {
			walk(d)
		}
	})
}

// Every algorithm a floodgate comment may name is one pkg/limiter's rules
// (and so its check script) run.
func TestEnvoyAlgorithmsAreTheEngines(t *testing.T) {
	for _, a := range Algorithms {
		if !Floodgate(a) {
			continue
		}
		burst := ""
		if a.HasBurst() {
			burst = ", burst: 20"
		}
		_, err := limiter.ParseRules("r.yaml", []byte("version: 1\nrules:\n  - {id: x, tier: principal, limit: 10, period: 1m, algorithm: "+string(a)+burst+"}\n"))
		require.NoError(t, err, a)
	}
}
