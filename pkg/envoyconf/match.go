package envoyconf

import "strings"

// Entry is one key/value pair of a request descriptor.
type Entry struct {
	Key, Value string
}

// Match is the limit a request descriptor selects.
type Match struct {
	Limit *Limit
	// CounterValues are the values that name the counter, one per entry: the
	// request's own values, except where a share_threshold wildcard matched,
	// which puts the wildcard pattern in its place so every matching value
	// shares one counter.
	CounterValues []string
}

// Lookup finds the limit for one descriptor of domain, as envoy ratelimit
// does: level by level, "key_value" first, then the first wildcard value that
// matches, then "key" alone; the limit counts only if it sits on the node of
// the descriptor's last entry. A nil Limit means no rule matched (OK).
func (c *Config) Lookup(domain string, entries []Entry) Match {
	if c == nil {
		return Match{}
	}
	level := c.domains[domain]
	if level == nil || len(entries) == 0 {
		return Match{}
	}
	var shared []string
	for i, e := range entries {
		composite := e.Key + "_" + e.Value
		next := level.children[composite]
		wild := false
		if next == nil {
			for _, w := range level.wildcards {
				if wildcardMatch(w.parts, composite) {
					next, wild = level.children[w.composite], true
					break
				}
			}
		}
		if next == nil {
			next = level.children[e.Key]
		}
		if next == nil {
			return Match{}
		}
		if wild && next.share {
			if shared == nil {
				shared = make([]string, len(entries))
			}
			shared[i] = next.pattern
		}
		if i == len(entries)-1 {
			if next.limit == nil {
				return Match{}
			}
			vals := make([]string, len(entries))
			for j, e := range entries {
				vals[j] = e.Value
				if shared != nil && shared[j] != "" {
					vals[j] = shared[j]
				}
			}
			return Match{Limit: next.limit, CounterValues: vals}
		}
		if len(next.children) == 0 {
			return Match{}
		}
		level = next
	}
	return Match{}
}

// wildcardMatch reports whether s matches the pattern split on '*' into parts:
// each '*' stands for zero or more characters.
func wildcardMatch(parts []string, s string) bool {
	if len(parts) == 1 {
		return parts[0] == s
	}
	first, last := parts[0], parts[len(parts)-1]
	if len(s) < len(first)+len(last) || !strings.HasPrefix(s, first) || !strings.HasSuffix(s, last) {
		return false
	}
	rest := s[len(first) : len(s)-len(last)]
	for _, p := range parts[1 : len(parts)-1] {
		i := strings.Index(rest, p)
		if i < 0 {
			return false
		}
		rest = rest[i+len(p):]
	}
	return true
}
