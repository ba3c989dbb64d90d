package gateway

import (
	"fmt"
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
	segments []string // literal, or "" for a parameter
	params   []string // parameter name per segment ("" for literals)
	literals int
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
		for _, seg := range splitPath(rt.Template) {
			if strings.HasPrefix(seg, "{") {
				c.segments = append(c.segments, "")
				c.params = append(c.params, strings.Trim(seg, "{}"))
			} else {
				c.segments = append(c.segments, seg)
				c.params = append(c.params, "")
				c.literals++
			}
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

// Match finds the most specific route (most literal segments) for method and path.
func (r *Router) Match(method, path string) Match {
	segs := splitPath(path)
	var best *compiledRoute
	var bestVals []string
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
		for i, name := range best.params {
			if name != "" {
				res = strings.ReplaceAll(res, "{"+name+"}", bestVals[i])
			}
		}
		if events.ValidResource(res) == nil { // a hostile path segment never reaches the limiter
			m.Resource = res
		}
	}
	return m
}

func (c *compiledRoute) match(segs []string) ([]string, bool) {
	vals := make([]string, len(segs))
	for i, s := range segs {
		if c.segments[i] == "" {
			if s == "" {
				return nil, false
			}
			vals[i] = s
		} else if c.segments[i] != s {
			return nil, false
		}
	}
	return vals, true
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
