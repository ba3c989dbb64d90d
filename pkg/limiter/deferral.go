package limiter

import (
	"fmt"
	"net/http"
	"regexp"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// OnLimit values: what happens to a request a rule denies (or the limiter
// sheds) on the rule's route.
const (
	OnLimitReject = "reject" // the 429 (or shed 503) contract; the default
	OnLimitDefer  = "defer"  // queued on floodgate.deferred.v1 and replayed at the rule's pace
)

// Bounds of a deferral policy. MaxDeferBody keeps a deferred request, base64
// encoded with its headers, inside one Kafka message (a broker's default
// message.max.bytes is 1 MB) and inside the consumer's 256 KiB door.
const (
	MaxDeferBody           = 128 << 10
	DefaultDeferBody       = 64 << 10
	DefaultDeferPrincipal  = 1000
	DefaultDeferRoute      = 100_000
	maxDeferQueuedRoute    = 10_000_000
	maxDeferAge            = 24 * time.Hour
	maxDeferHeaders        = 32
	deferHeaderNamePattern = `^[!#$%&'*+.^_` + "`" + `|~0-9A-Za-z-]{1,64}$`
)

// DeferPolicy is how a deferrable route's requests are queued: from a rule
// with on_limit: defer. Immutable.
type DeferPolicy struct {
	RuleID string
	Method string
	Route  string
	// MaxAge is how long a deferred request may wait; past it, it is expired
	// (dead-lettered with that reason, the client told so), never sent.
	MaxAge time.Duration
	// MaxQueuedPrincipal and MaxQueuedRoute bound the requests waiting per
	// principal on the route and per route; past either the client gets the
	// plain 429.
	MaxQueuedPrincipal int
	MaxQueuedRoute     int
	// MaxBody is the largest request body deferred, in bytes; a larger one
	// gets the plain 429.
	MaxBody int
	// Headers are the request headers kept for the replay (canonical form).
	// Credentials are never among them (see CredentialHeader).
	Headers []string
}

type fileDefer struct {
	MaxAge    string         `yaml:"max_age"`
	MaxQueued fileDeferQueue `yaml:"max_queued"`
	MaxBody   *int           `yaml:"max_body"`
	Headers   []string       `yaml:"headers"`
}

type fileDeferQueue struct {
	Principal int `yaml:"principal"`
	Route     int `yaml:"route"`
}

var deferKeys = []string{"max_age", "max_queued", "max_body", "headers"}

var deferHeaderName = regexp.MustCompile(deferHeaderNamePattern)

// CredentialHeader reports whether a header carries credentials or hop state
// that a deferred request must never store: the replay carries the verified
// principal instead (docs/deferred.md).
func CredentialHeader(name string) bool {
	switch http.CanonicalHeaderKey(name) {
	case "Authorization", "Proxy-Authorization", "Cookie", "Set-Cookie", "X-Api-Key", "Api-Key", "X-Auth-Token",
		"X-Csrf-Token", "X-Xsrf-Token", "Idempotency-Key",
		"Connection", "Keep-Alive", "Proxy-Connection", "Te", "Trailer", "Transfer-Encoding", "Upgrade", "Host", "Content-Length":
		return true
	}
	n := strings.ToLower(name)
	return strings.HasPrefix(n, "x-floodgate-") || strings.HasPrefix(n, "x-principal-") || strings.Contains(n, "token") ||
		strings.Contains(n, "secret") || strings.Contains(n, "password") || strings.Contains(n, "session")
}

// Deferral returns the deferral policy of a route, or nil when its denied
// requests are rejected.
func (rs *Ruleset) Deferral(method, route string) *DeferPolicy {
	if len(rs.deferral) == 0 {
		return nil
	}
	return rs.deferral[method+" "+route]
}

// Deferrals lists every deferral policy, in rule order.
func (rs *Ruleset) Deferrals() []*DeferPolicy {
	var out []*DeferPolicy
	for i := range rs.Rules {
		if d := rs.Rules[i].Defer; d != nil {
			out = append(out, d)
		}
	}
	return out
}

// deferral validates a rule's on_limit and defer fields and records its policy.
func (p *parser) deferral(rs *Ruleset, n *yaml.Node, path string, fr fileRule, r *Rule) {
	switch fr.OnLimit {
	case "", OnLimitReject:
		if fr.Defer != nil {
			p.fail(p.line(n, "defer"), path+".defer", "only a rule with on_limit: defer has a defer block")
		}
		return
	case OnLimitDefer:
	default:
		p.fail(p.line(n, "on_limit"), path+".on_limit", "%q: want one of reject|defer", fr.OnLimit)
		return
	}
	if r.Tier != events.TierEndpoint && r.Tier != events.TierResource {
		p.fail(p.line(n, "on_limit"), path+".on_limit", "defer needs a route: only endpoint and resource rules defer")
		return
	}
	dn := child(n, "defer")
	if fr.Defer == nil {
		p.fail(p.line(n, "on_limit"), path+".defer", "required with on_limit: defer (at least max_age)")
		return
	}
	fd := fr.Defer
	d := &DeferPolicy{RuleID: fr.ID, Method: fr.Method, Route: fr.Route, MaxBody: DefaultDeferBody,
		MaxQueuedPrincipal: DefaultDeferPrincipal, MaxQueuedRoute: DefaultDeferRoute}
	age, err := time.ParseDuration(fd.MaxAge)
	switch {
	case fd.MaxAge == "":
		p.fail(p.line(dn, "max_age"), path+".defer.max_age", "required, a duration such as 30s, 5m or 1h")
	case err != nil:
		p.fail(p.line(dn, "max_age"), path+".defer.max_age", "%q: want a duration such as 30s, 5m or 1h", fd.MaxAge)
	case age < time.Second || age > maxDeferAge:
		p.fail(p.line(dn, "max_age"), path+".defer.max_age", "%s: must be in 1s..24h", age)
	}
	d.MaxAge = age
	qn := child(dn, "max_queued")
	if fd.MaxQueued.Principal != 0 {
		d.MaxQueuedPrincipal = fd.MaxQueued.Principal
		if d.MaxQueuedPrincipal < 1 || d.MaxQueuedPrincipal > 1_000_000 {
			p.fail(p.line(qn, "principal"), path+".defer.max_queued.principal", "%d: must be in 1..1000000", d.MaxQueuedPrincipal)
		}
	}
	if fd.MaxQueued.Route != 0 {
		d.MaxQueuedRoute = fd.MaxQueued.Route
		if d.MaxQueuedRoute < 1 || d.MaxQueuedRoute > maxDeferQueuedRoute {
			p.fail(p.line(qn, "route"), path+".defer.max_queued.route", "%d: must be in 1..%d", d.MaxQueuedRoute, maxDeferQueuedRoute)
		}
	}
	if d.MaxQueuedPrincipal > d.MaxQueuedRoute {
		p.fail(p.line(dn, "max_queued"), path+".defer.max_queued", "principal (%d) must not exceed route (%d)", d.MaxQueuedPrincipal, d.MaxQueuedRoute)
	}
	if fd.MaxBody != nil {
		d.MaxBody = *fd.MaxBody
		if d.MaxBody < 0 || d.MaxBody > MaxDeferBody {
			p.fail(p.line(dn, "max_body"), path+".defer.max_body", "%d: must be in 0..%d bytes", d.MaxBody, MaxDeferBody)
		}
	}
	if len(fd.Headers) > maxDeferHeaders {
		p.fail(p.line(dn, "headers"), path+".defer.headers", "%d headers: at most %d", len(fd.Headers), maxDeferHeaders)
	}
	for j, h := range fd.Headers {
		where := fmt.Sprintf("%s.defer.headers[%d]", path, j)
		c := http.CanonicalHeaderKey(h)
		switch {
		case !deferHeaderName.MatchString(h):
			p.fail(p.line(dn, "headers"), where, "%q: not a header name", h)
		case CredentialHeader(h):
			p.fail(p.line(dn, "headers"), where, "%q carries credentials or connection state and is never stored; the replay carries the verified principal", h)
		case slices.Contains(d.Headers, c):
			p.fail(p.line(dn, "headers"), where, "%q is listed twice", h)
		default:
			d.Headers = append(d.Headers, c)
		}
	}
	k := fr.Method + " " + fr.Route
	if rs.deferral == nil {
		rs.deferral = map[string]*DeferPolicy{}
	}
	if prev, dup := rs.deferral[k]; dup {
		p.fail(p.line(n, "on_limit"), path+".on_limit", "%s is already deferred by rule %s", k, prev.RuleID)
		return
	}
	rs.deferral[k] = d
	r.Defer = d
}
