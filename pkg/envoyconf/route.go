package envoyconf

import (
	"cmp"
	"strings"
)

// MaxRouteLen bounds a route as decision.v1 does (events.MaxRouteLen).
const MaxRouteLen = 256

// RouteJoin appends segment, percent-encoded to RFC 3986 pchar characters,
// to route ("" for none) — or returns route unchanged when the result would
// be longer than MaxRouteLen. A first segment too long on its own is cut.
func RouteJoin(route, segment string) string {
	if route == "/" { // the root: the segment is the first
		route = ""
	}
	if segment == "" { // no empty segments in a route
		return cmp.Or(route, "/")
	}
	var b strings.Builder
	b.Grow(len(route) + 1 + len(segment))
	b.WriteString(route)
	b.WriteByte('/')
	for i := 0; i < len(segment); i++ {
		c := segment[i]
		if pchar(c) {
			if route == "" && b.Len() >= MaxRouteLen {
				break
			}
			b.WriteByte(c)
			continue
		}
		if route == "" && b.Len()+3 > MaxRouteLen {
			break
		}
		const hex = "0123456789ABCDEF"
		b.WriteByte('%')
		b.WriteByte(hex[c>>4])
		b.WriteByte(hex[c&15])
	}
	if route != "" && b.Len() > MaxRouteLen {
		return route
	}
	return b.String()
}

// pchar reports whether c stands for itself in a route segment: RFC 3986
// unreserved, sub-delims, ':' and '@'.
func pchar(c byte) bool {
	switch {
	case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', '0' <= c && c <= '9':
		return true
	}
	return strings.IndexByte("-._~!$&'()*+,;=:@", c) >= 0
}

// DomainRoute is the route of a call for domain that matched no counted
// limit: "/domain".
func DomainRoute(domain string) string { return RouteJoin("", domain) }

// overrideRoute is the route of a limit Envoy sent with the descriptor: the
// domain and the entries' keys (never their values, which are the call's).
func overrideRoute(domain string, entries []Entry) string {
	r := RouteJoin("", domain)
	for _, en := range entries {
		r = RouteJoin(r, en.Key)
	}
	return r
}
