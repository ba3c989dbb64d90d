package envoyconf

import (
	"errors"
	"fmt"
	"strings"

	"github.com/floodgate-dev/floodgate/pkg/limiter"

	"go.yaml.in/yaml/v3"
)

// Floodgate's own options for one limit travel in a YAML comment on the
// descriptor that holds the limit:
//
//	- key: user
//	  # floodgate: {algorithm: gcra, burst: 20, fail: closed}
//	  rate_limit: {unit: second, requests_per_unit: 10}
//
// A comment is the one place envoy ratelimit provably ignores: its loader
// (src/config/config_impl.go, gopkg.in/yaml.v2 into a generic map, then
// validKeys) refuses every key it does not know, anywhere in a file, and its
// runtime loader (github.com/lyft/goruntime) reads every file of the
// configuration directory whatever its name, so neither an extra key nor a
// side file in the directory would keep the directory loadable by it. YAML
// comments are not part of the document it decodes.

// The algorithms a limit may select are pkg/limiter's (limiter.Algorithm, one
// definition). FixedWindow is envoy ratelimit's own here (INCRBY per window,
// every hit counted, over the limit included) and the default; the others
// are Floodgate's (pkg/limiter's check script), which consume nothing when
// they deny.

// Algorithms lists every algorithm a floodgate comment may name.
var Algorithms = []limiter.Algorithm{limiter.FixedWindow, limiter.TokenBucket, limiter.GCRA, limiter.SlidingWindow,
	limiter.LeakyBucket, limiter.SlidingLog}

// Floodgate reports whether a is Floodgate's own rather than envoy
// ratelimit's fixed window.
func Floodgate(a limiter.Algorithm) bool { return a != "" && a != limiter.FixedWindow }

// MaxSlidingLogLimit bounds a sliding_window_log limit, as pkg/limiter's
// rules file does: its state is one sorted-set member per unit in the window.
const MaxSlidingLogLimit = limiter.MaxSlidingLogLimit

// FailPolicy says how a limit answers when Redis cannot be asked.
type FailPolicy string

// Fail policies. Unset, a call whose counters cannot be read fails with
// UNAVAILABLE, as envoy ratelimit's does, and Envoy's failure_mode_deny
// decides.
const (
	FailOpen   FailPolicy = "open"   // the descriptor answers OK
	FailClosed FailPolicy = "closed" // the descriptor answers OVER_LIMIT
)

// Extension is a limit's Floodgate-only options.
type Extension struct {
	Algorithm limiter.Algorithm // "" or limiter.FixedWindow: envoy ratelimit's fixed window
	// Burst is the capacity of token_bucket, gcra and leaky_bucket; 0 means
	// requests_per_unit.
	Burst uint32
	Fail  FailPolicy
	// Source is "file:line" of the comment.
	Source string
}

const extensionKeys = "algorithm, burst, fail"

// directive is one floodgate comment line found in a file.
type directive struct {
	text string // the comment line, "# floodgate: {…}"
	line int
}

// directives returns the floodgate comment lines of a node's comments;
// near is a line of the node, to find each comment's own line.
func (l *loader) directives(comment string, near int) []directive {
	var out []directive
	for _, c := range strings.Split(comment, "\n") {
		c = strings.TrimSpace(c)
		if !isDirective(strings.TrimSpace(strings.TrimPrefix(c, "#"))) {
			continue
		}
		out = append(out, directive{text: c, line: l.lineOf(c, near)})
	}
	return out
}

// isDirective reports whether a comment's text is meant for Floodgate: it
// starts with the lowercase word floodgate (then ':', '{', '=', a space or
// nothing). Such a comment must parse, so a typo is an error rather than an
// ignored comment; prose ("Floodgate's …") is not one.
func isDirective(body string) bool {
	rest, ok := strings.CutPrefix(body, "floodgate")
	return ok && (rest == "" || strings.ContainsRune(":{= \t", rune(rest[0])))
}

// lineOf is the line (1-based) holding comment closest to near.
func (l *loader) lineOf(comment string, near int) int {
	best, dist := near, -1
	for i, ln := range l.lines {
		if !strings.Contains(ln, comment) {
			continue
		}
		d := i + 1 - near
		if d < 0 {
			d = -d
		}
		if dist < 0 || d < dist {
			best, dist = i+1, d
		}
	}
	return best
}

// descriptorDirectives are the floodgate comments that belong to descriptor
// m: above or on the lines of its key, value and rate_limit, or above the
// descriptor. Each is marked used.
func (l *loader) descriptorDirectives(m *yaml.Node) []directive {
	var out []directive
	add := func(n *yaml.Node, comments ...string) {
		for _, c := range comments {
			for _, d := range l.directives(c, n.Line) {
				l.used[d.line] = true
				out = append(out, d)
			}
		}
	}
	add(m, m.HeadComment, m.LineComment)
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, v := m.Content[i], m.Content[i+1]
		switch kn.Value {
		case "key", "value", "rate_limit":
			add(kn, kn.HeadComment, kn.LineComment)
			add(v, v.HeadComment, v.LineComment)
		}
	}
	return out
}

// extension parses the floodgate comments of one descriptor into its limit.
func (l *loader) extension(m *yaml.Node, lim *Limit) error {
	ds := l.descriptorDirectives(m)
	if len(ds) == 0 {
		return nil
	}
	if len(ds) > 1 {
		return &posError{file: l.file, line: ds[1].line, msg: fmt.Sprintf("a second floodgate comment on this descriptor (the first is on line %d); put every option in one", ds[0].line)}
	}
	d := ds[0]
	fail := func(format string, args ...any) error {
		return &posError{file: l.file, line: d.line, msg: "floodgate comment: " + fmt.Sprintf(format, args...)}
	}
	if lim == nil {
		return fail("this descriptor has no rate_limit to apply it to")
	}
	body := strings.TrimSpace(strings.TrimPrefix(d.text, "#"))
	rest, ok := strings.CutPrefix(body, "floodgate:")
	if !ok {
		return fail("want `# floodgate: {%s}`, not %q", extensionKeys, body)
	}
	var n yaml.Node
	if err := yaml.Unmarshal([]byte(rest), &n); err != nil {
		return fail("want a YAML flow mapping {%s}: %v", extensionKeys, strings.TrimPrefix(err.Error(), "yaml: "))
	}
	if len(n.Content) == 0 || n.Content[0].Kind != yaml.MappingNode {
		return fail("want a YAML flow mapping {%s}, not %q", extensionKeys, strings.TrimSpace(rest))
	}
	ext := &Extension{Source: fmt.Sprintf("%s:%d", l.file, d.line)}
	sub := &loader{file: l.file, opts: l.opts}
	err := sub.fields(n.Content[0], func(k string, _ *yaml.Node, v *yaml.Node) error {
		switch k {
		case "algorithm":
			s, err := sub.str(v, k)
			if err != nil {
				return err
			}
			ext.Algorithm = limiter.Algorithm(s)
			for _, a := range Algorithms {
				if a == ext.Algorithm {
					return nil
				}
			}
			return fmt.Errorf("algorithm %q: want one of %s", s, algorithmNames())
		case "burst":
			b, err := sub.uint32(v, k)
			if err == nil && b == 0 {
				return fmt.Errorf("burst must be at least 1")
			}
			ext.Burst = b
			return err
		case "fail":
			s, err := sub.str(v, k)
			ext.Fail = FailPolicy(s)
			if err == nil && ext.Fail != FailOpen && ext.Fail != FailClosed {
				return fmt.Errorf("fail %q: want open or closed", s)
			}
			return err
		}
		return fmt.Errorf("unknown option %q (allowed: %s)", k, extensionKeys)
	})
	if err != nil {
		var pe *posError
		if errors.As(err, &pe) {
			return fail("%s", pe.msg)
		}
		return fail("%v", err)
	}
	switch {
	case lim.Unlimited && Floodgate(ext.Algorithm):
		return fail("an unlimited rate_limit counts nothing; algorithm %s does not apply", ext.Algorithm)
	case ext.Burst > 0 && !ext.Algorithm.HasBurst():
		return fail("burst needs an algorithm with a capacity (token_bucket, gcra, leaky_bucket), not %q", cmpOr(string(ext.Algorithm), string(limiter.FixedWindow)))
	case ext.Algorithm == limiter.SlidingLog && lim.RequestsPerUnit > MaxSlidingLogLimit:
		return fail("sliding_window_log keeps one entry per request; requests_per_unit must be at most %d (use sliding_window)", MaxSlidingLogLimit)
	case Floodgate(ext.Algorithm) && lim.RequestsPerUnit == 0:
		return fail("algorithm %s needs requests_per_unit of at least 1", ext.Algorithm)
	}
	lim.Ext = ext
	return nil
}

// strayDirectives refuses floodgate comments that belong to no descriptor's
// limit (every used one was marked by descriptorDirectives).
func (l *loader) strayDirectives(doc *yaml.Node) error {
	var walk func(n *yaml.Node) error
	walk = func(n *yaml.Node) error {
		for _, c := range []string{n.HeadComment, n.LineComment, n.FootComment} {
			for _, d := range l.directives(c, n.Line) {
				if !l.used[d.line] {
					return &posError{file: l.file, line: d.line, msg: "floodgate comment outside a descriptor: put it on the line of the descriptor's key, value or rate_limit, or on the line above"}
				}
			}
		}
		for _, c := range n.Content {
			if err := walk(c); err != nil {
				return err
			}
		}
		return nil
	}
	return walk(doc)
}

func algorithmNames() string {
	s := make([]string, len(Algorithms))
	for i, a := range Algorithms {
		s[i] = string(a)
	}
	return strings.Join(s, ", ")
}

func cmpOr(a, b string) string {
	if a != "" {
		return a
	}
	return b
}
