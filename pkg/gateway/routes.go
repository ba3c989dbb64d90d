package gateway

import (
	"fmt"
	"net/url"
	"strconv"
	"strings"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Route is one templated route the gateway serves.
type Route struct {
	Method   string // GET, POST, …
	Template string // e.g. /channels/{channel_id}/messages
	// Resource names what the request touches, with {param} references filled from
	// the path, e.g. "channel:{channel_id}". Empty means none.
	Resource string
	Cost     int // 0 means 1
}

type compiledRoute struct {
	Route
	segments []segment
	params   []string // every parameter name, in order
	literals int      // literal characters: more is more specific
}

// segment is one path segment of a template: literal runs (percent-decoded)
// and parameters, alternating; two parameters never touch (the route grammar
// refuses "{a}{b}").
type segment []part

type part struct {
	lit   string // literal text, decoded
	param string // parameter name; lit is empty
}

// Router maps a request's method and path to its route template, so limits are
// counted per template (/channels/{channel_id}/messages) and not per raw path.
type Router struct {
	routes   []compiledRoute
	fallback string
}

// Match is the route a request matched and the resource it touches.
type Match struct {
	Template string
	Resource string
	Cost     int
}

// NewRouter compiles routes; fallback is the template used for paths no route
// matches (default "/{unmatched}"), which keeps unknown paths in one bucket instead
// of one per raw path.
func NewRouter(routes []Route, fallback string) (*Router, error) {
	if fallback == "" {
		fallback = "/{unmatched}"
	}
	if err := events.ValidRoute(fallback); err != nil {
		return nil, fmt.Errorf("fallback route: %w", err)
	}
	r := &Router{fallback: fallback}
	for i, rt := range routes {
		if err := events.ValidMethod(rt.Method); err != nil {
			return nil, fmt.Errorf("routes[%d].method: %w", i, err)
		}
		if err := events.ValidRoute(rt.Template); err != nil {
			return nil, fmt.Errorf("routes[%d].template: %w", i, err)
		}
		c := compiledRoute{Route: rt}
		for _, raw := range splitPath(rt.Template) {
			seg := compileSegment(raw)
			for _, p := range seg {
				if p.param != "" {
					c.params = append(c.params, p.param)
				}
				c.literals += len(p.lit)
			}
			c.segments = append(c.segments, seg)
		}
		if strings.Contains(rt.Resource, "{") {
			for _, ref := range paramRefs(rt.Resource) {
				if !contains(c.params, ref) {
					return nil, fmt.Errorf("routes[%d].resource: {%s} is not a parameter of %s", i, ref, rt.Template)
				}
			}
		}
		r.routes = append(r.routes, c)
	}
	return r, nil
}

// Match finds the most specific route (most literal characters) for method
// and path. path is the request's escaped path (r.URL.EscapedPath()): it is
// split on "/" first and each segment is then percent-decoded, so an encoded
// "%2F" stays inside its segment.
func (r *Router) Match(method, path string) Match {
	segs := splitPath(path)
	for i, s := range segs {
		if u, err := url.PathUnescape(s); err == nil {
			segs[i] = u
		}
	}
	var best *compiledRoute
	var bestVals map[string]string
	for i := range r.routes {
		c := &r.routes[i]
		if c.Method != method || len(c.segments) != len(segs) {
			continue
		}
		vals, ok := c.match(segs)
		if ok && (best == nil || c.literals > best.literals) {
			best, bestVals = c, vals
		}
	}
	if best == nil {
		return Match{Template: r.fallback, Cost: 1}
	}
	m := Match{Template: best.Template, Cost: max(best.Cost, 1)}
	if best.Resource != "" {
		res := best.Resource
		for name, v := range bestVals {
			res = strings.ReplaceAll(res, "{"+name+"}", url.PathEscape(v)) // one spelling per value
		}
		if events.ValidResource(res) == nil { // a hostile path segment never reaches the limiter
			m.Resource = res
		}
	}
	return m
}

func (c *compiledRoute) match(segs []string) (map[string]string, bool) {
	var vals map[string]string
	if len(c.params) > 0 {
		vals = make(map[string]string, len(c.params))
	}
	for i, s := range segs {
		if !c.segments[i].match(s, vals) {
			return nil, false
		}
	}
	return vals, true
}

// match reports whether s matches the segment, recording parameter values in
// vals. A parameter takes at least one byte and, when a literal follows, the
// shortest value after which the rest still matches.
func (seg segment) match(s string, vals map[string]string) bool {
	if len(seg) == 0 {
		return s == ""
	}
	p := seg[0]
	if p.param == "" {
		return strings.HasPrefix(s, p.lit) && seg[1:].match(s[len(p.lit):], vals)
	}
	if len(seg) == 1 {
		if s == "" {
			return false
		}
		vals[p.param] = s
		return true
	}
	next := seg[1].lit // parameters never touch: a literal follows
	for i := 1; i <= len(s)-len(next); i++ {
		if strings.HasPrefix(s[i:], next) && seg[1:].match(s[i:], vals) {
			vals[p.param] = s[:i]
			return true
		}
	}
	return false
}

// compileSegment splits a valid template segment into literal runs and parameters.
func compileSegment(raw string) segment {
	var seg segment
	for raw != "" {
		if raw[0] == '{' {
			j := strings.IndexByte(raw, '}')
			seg = append(seg, part{param: raw[1:j]})
			raw = raw[j+1:]
			continue
		}
		j := strings.IndexByte(raw, '{')
		if j < 0 {
			j = len(raw)
		}
		lit := raw[:j]
		if u, err := url.PathUnescape(lit); err == nil {
			lit = u
		}
		seg = append(seg, part{lit: lit})
		raw = raw[j:]
	}
	return seg
}

func splitPath(p string) []string {
	p = strings.Trim(p, "/")
	if p == "" {
		return nil
	}
	return strings.Split(p, "/")
}

func paramRefs(s string) []string {
	var out []string
	for {
		i := strings.IndexByte(s, '{')
		if i < 0 {
			return out
		}
		j := strings.IndexByte(s[i:], '}')
		if j < 0 {
			return append(out, s[i+1:])
		}
		out = append(out, s[i+1:i+j])
		s = s[i+j+1:]
	}
}

func contains(list []string, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

// ParseRoute parses "METHOD /template [resource=type:{param}] [cost=N]".
func ParseRoute(line string) (Route, error) {
	f := strings.Fields(line)
	if len(f) < 2 {
		return Route{}, fmt.Errorf("route %q: want METHOD /template [resource=…] [cost=N]", line)
	}
	rt := Route{Method: f[0], Template: f[1]}
	for _, opt := range f[2:] {
		k, v, ok := strings.Cut(opt, "=")
		switch {
		case ok && k == "resource":
			rt.Resource = v
		case ok && k == "cost":
			n, err := strconv.Atoi(v)
			if err != nil || n < 1 {
				return Route{}, fmt.Errorf("route %q: cost %q is not a positive integer", line, v)
			}
			rt.Cost = n
		default:
			return Route{}, fmt.Errorf("route %q: unknown option %q", line, opt)
		}
	}
	return rt, nil
}
