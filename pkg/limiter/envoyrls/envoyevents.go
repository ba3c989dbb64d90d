package envoyrls

import (
	"fmt"
	"math"
	"net/netip"
	"strings"
	"sync"
	"time"
	"unicode/utf8"
	"unsafe"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// EnvoyPrincipalKey is a descriptor key that names a call's principal, and
// the principal's kind.
type EnvoyPrincipalKey struct {
	Key  string
	Kind events.PrincipalKind
}

// EnvoyIdentity says which descriptor entries of a call for an envoy
// ratelimit domain name who made the request, so that the call becomes a
// decision.v1 event and the principal's penalty and the adjuster's scales
// apply to its limits.
type EnvoyIdentity struct {
	// Keys name the principal, the first present wins (looked for in every
	// descriptor of the call, in order). A key equal to IPKey names an
	// anonymous principal keyed by the client address as pkg/gateway keys
	// one (gateway.AnonymousID): an IPv4 address, or its IPv6 /64.
	Keys []EnvoyPrincipalKey
	// IPKey's value is the client address (Envoy's remote_address action).
	IPKey string
	// MethodKey's value, when it is an HTTP method, is the event's method
	// (Envoy's request_headers action on :method); GET otherwise.
	MethodKey string
}

// DefaultEnvoyPrincipalKeys is FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS's default.
const DefaultEnvoyPrincipalKeys = "user,api_key,remote_address"

// UnknownIP is the event's ip when a call carries no client address: the
// unspecified address, never a real client's.
var UnknownIP = netip.IPv4Unspecified()

// ParseEnvoyPrincipalKeys reads a comma-separated list of key[=kind]:
// "user,api_key,session=anonymous,remote_address". A key named like a kind
// (user, bot, api_key) is of that kind; ipKey names an anonymous principal
// keyed by the client address; any other key needs its =kind.
func ParseEnvoyPrincipalKeys(spec, ipKey string) ([]EnvoyPrincipalKey, error) {
	var out []EnvoyPrincipalKey
	seen := map[string]bool{}
	for _, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		key, kind, explicit := strings.Cut(item, "=")
		if key == "" || len(key) > events.MaxEnvoyKeyLen {
			return nil, fmt.Errorf("%q: a key is 1-%d bytes", item, events.MaxEnvoyKeyLen)
		}
		if seen[key] {
			return nil, fmt.Errorf("key %q appears twice", key)
		}
		seen[key] = true
		k := events.PrincipalKind(kind)
		switch {
		case key == ipKey && (!explicit || k == events.PrincipalAnonymous):
			k = events.PrincipalAnonymous
		case key == ipKey:
			return nil, fmt.Errorf("%q: the client address key %q names anonymous principals only", item, ipKey)
		case !explicit && events.PrincipalKind(key).Valid() && key != string(events.PrincipalAnonymous):
			k = events.PrincipalKind(key)
		case !explicit:
			return nil, fmt.Errorf("%q: say which kind of principal it names: %s=user|bot|api_key|anonymous", item, key)
		case !k.Valid():
			return nil, fmt.Errorf("%q: kind %q is not one of user|bot|api_key|anonymous", item, kind)
		}
		out = append(out, EnvoyPrincipalKey{Key: key, Kind: k})
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("no keys: want key[=kind],… (e.g. %s), or none", DefaultEnvoyPrincipalKeys)
	}
	return out, nil
}

// envoyAnonIPv6Prefix is how many leading bits of an IPv6 client address
// key an anonymous principal: one subscriber's /64, pkg/gateway's default.
const envoyAnonIPv6Prefix = 64

// envoyWho is what a call's entries say about who made it.
type envoyWho struct {
	principal events.Principal
	ok        bool // a principal was found
	key       string
	raw       string // the entry value that named the principal
	ip        netip.Addr
	method    string
}

// identify finds the call's principal, client address and method.
func (id *EnvoyIdentity) identify(ds []envoyconf.Descriptor) envoyWho {
	w := envoyWho{method: "GET"}
	var ipRaw string
	ipFound, methodFound := false, false
	for _, d := range ds {
		for _, en := range d.Entries {
			switch {
			case !ipFound && en.Key == id.IPKey:
				if a, err := events.ParseIP(en.Value); err == nil {
					w.ip, ipRaw, ipFound = a, en.Value, true
				}
			case !methodFound && en.Key == id.MethodKey:
				if events.ValidMethod(en.Value) == nil {
					w.method, methodFound = en.Value, true
				}
			}
		}
	}
	for _, k := range id.Keys {
		if k.Key == id.IPKey {
			if ipFound {
				w.principal = events.Principal{Kind: events.PrincipalAnonymous, ID: gateway.AnonymousID(w.ip, envoyAnonIPv6Prefix)}
				w.key, w.raw, w.ok = k.Key, ipRaw, true
				return w
			}
			continue
		}
		for _, d := range ds {
			for _, en := range d.Entries {
				if en.Key != k.Key {
					continue
				}
				p := events.Principal{Kind: k.Kind, ID: en.Value}
				if p.Validate() == nil {
					w.principal, w.key, w.raw, w.ok = p, k.Key, en.Value, true
					return w
				}
			}
		}
	}
	return w
}

// tiers marks each descriptor with the tier its counter belongs to — the
// principal's own (it carries the entry that named the principal: it is
// penalized), the client address's, or shared by everyone on the path
// (endpoint) — and sets the penalty key when any descriptor is the
// principal's.
func (w *envoyWho) tiers(req *envoyconf.Request, ipKey string) []events.Tier {
	tiers := make([]events.Tier, len(req.Descriptors))
	for i := range req.Descriptors {
		d := &req.Descriptors[i]
		tiers[i] = events.TierEndpoint
		for _, en := range d.Entries {
			if w.ok && en.Key == w.key && en.Value == w.raw {
				tiers[i], d.Penalize = events.TierPrincipal, true
				break
			}
			if en.Key == ipKey {
				tiers[i] = events.TierIP
			}
		}
	}
	if w.ok {
		req.PenaltyKey = redisx.PenaltyKey(string(w.principal.Kind), w.principal.ID)
	}
	return tiers
}

// envoyNearLimit is envoy ratelimit's near-limit ratio.
const envoyNearLimit = 0.8

// envoyDecision is the decision.v1 event of one call: the deciding
// descriptor is the first over its limit, else the first a shadow or quota
// mode let through over its limit, else the one with the least room left.
func envoyDecision(id, gateway string, w *envoyWho, req *envoyconf.Request, resp *envoyconf.Response, tiers []events.Tier, sc *envoyScratch) events.Decision {
	pick := -1
	for i, st := range resp.Statuses {
		if st.Code == envoyconf.CodeOverLimit {
			pick = i
			break
		}
	}
	shadow := resp.Shadowed
	for i, st := range resp.Statuses {
		if st.Shadowed || st.QuotaExceeded {
			shadow = true
			if pick < 0 {
				pick = i
			}
		}
	}
	if pick < 0 {
		room := math.Inf(1)
		for i, st := range resp.Statuses {
			if st.Effective == 0 {
				continue
			}
			if r := float64(st.LimitRemaining) / float64(st.Effective); r < room {
				pick, room = i, r
			}
		}
	}
	ev := events.Decision{
		ID: id, TS: resp.Now.UTC(), Principal: w.principal, IP: w.ip, Method: w.method,
		Allowed: resp.Overall != envoyconf.CodeOverLimit, Tier: events.TierEndpoint,
		Shadow: shadow, Cost: 1, Gateway: gateway,
		Envoy: envoyCall(req, sc), Degraded: resp.Degraded,
	}
	if !ev.IP.IsValid() {
		ev.IP = UnknownIP
	}
	hits := uint64(max(req.HitsAddend, 1))
	if pick >= 0 {
		st := resp.Statuses[pick]
		if h := req.Descriptors[pick].HitsAddend; h != nil {
			hits = *h
		}
		ev.Tier = tiers[pick]
		if st.Limit != nil {
			ev.Route = st.Limit.Route
			switch {
			case st.Override != nil: // Envoy's own limit: named by its keys, never the call's values
				ev.Rule = "override:" + st.Limit.Route
			case st.Limit.Name != "":
				ev.Rule = st.Limit.Name
			default:
				ev.Rule = st.Limit.Path
			}
			ev.Rule, _ = eventText(ev.Rule, events.MaxRuleLen)
		}
		ev.Limit, ev.Remaining = int64(st.Effective), int64(st.LimitRemaining)
		if st.Code == envoyconf.CodeOverLimit || st.QuotaExceeded {
			ev.Remaining = 0
		}
		ev.NearLimit = ev.Allowed && st.Effective > 0 && float64(st.Count) >= envoyNearLimit*float64(st.Effective)
		// As on the own path: a denial while a penalty shrinks the
		// principal's limit is the penalty's doing.
		if !ev.Allowed && st.Penalty < 1 && ev.Tier != events.TierIP {
			ev.Tier = events.TierPenalty
		}
	}
	if ev.Route == "" { // no counted limit decided: the domain's route
		ev.Route = envoyconf.DomainRoute(req.Domain)
	}
	ev.Cost = int64(min(max(hits, 1), 1_000_000))
	if resp.Penalty > 0 && resp.Penalty < 1 {
		ev.PenaltyMultiplier = resp.Penalty
	}
	return ev
}

// envoyUnavailable is the decision.v1 event of a call that failed because
// Redis could not count it (and some counted limit has no fail policy):
// degraded, allowed as Envoy's failure_mode_deny makes it, with no limit
// and the domain's route.
func envoyUnavailable(id, gateway string, w *envoyWho, req *envoyconf.Request, allowed bool, tiers []events.Tier, sc *envoyScratch) events.Decision {
	ev := events.Decision{
		ID: id, TS: time.Now().UTC(), Principal: w.principal, IP: w.ip, Method: w.method,
		Route: envoyconf.DomainRoute(req.Domain), Allowed: allowed, Tier: events.TierEndpoint,
		Cost: envoyUnits(req, tiers), Gateway: gateway, Degraded: true, Envoy: envoyCall(req, sc),
	}
	if !ev.IP.IsValid() {
		ev.IP = UnknownIP
	}
	ev.Cost = min(max(ev.Cost, 1), 1_000_000)
	return ev
}

// envoyScratch is where one call's event keeps its envoy object: the
// object and its slices' backing arrays (decision.v1 bounds them), taken
// from envoyScratches and given back once Server.Emit has returned (Emit
// copies what it keeps), so an event allocates none of it.
type envoyScratch struct {
	call    events.EnvoyCall
	descs   [events.MaxEnvoyDescriptors]events.EnvoyDescriptor
	entries [events.MaxEnvoyDescriptors * events.MaxEnvoyEntries]events.EnvoyEntry
	used    int // entries in use
	id      [server.DecisionIDLen]byte
}

// decisionID mints the event's decision id into sc: a string over sc's
// bytes, valid until release (Server.Emit keeps nothing of the event), so
// the id allocates nothing either.
func (sc *envoyScratch) decisionID() string {
	server.MintDecisionID(&sc.id)
	return unsafe.String(&sc.id[0], len(sc.id))
}

var envoyScratches = sync.Pool{New: func() any { return new(envoyScratch) }}

func newEnvoyScratch() *envoyScratch { return envoyScratches.Get().(*envoyScratch) }

// release forgets what sc refers to and gives it back for reuse; the event
// built in it must not be used afterwards.
func (sc *envoyScratch) release() {
	clear(sc.entries[:sc.used])
	clear(sc.descs[:])
	sc.call, sc.used = events.EnvoyCall{}, 0
	envoyScratches.Put(sc)
}

// envoyCall is the event's copy of the call, within decision.v1's bounds,
// built in sc (nil: a new one).
func envoyCall(req *envoyconf.Request, sc *envoyScratch) *events.EnvoyCall {
	if sc == nil {
		sc = new(envoyScratch)
	}
	c := &sc.call
	*c = events.EnvoyCall{}
	var cut bool
	c.Domain, cut = eventText(req.Domain, events.MaxEnvoyDomainLen)
	c.Truncated = c.Truncated || cut
	ds := req.Descriptors
	if len(ds) > events.MaxEnvoyDescriptors {
		ds, c.Truncated = ds[:events.MaxEnvoyDescriptors], true
	}
	c.Descriptors = sc.descs[:len(ds):len(ds)]
	n := 0
	for i, d := range ds {
		ens := d.Entries
		if len(ens) > events.MaxEnvoyEntries {
			ens, c.Truncated = ens[:events.MaxEnvoyEntries], true
		}
		out := sc.entries[n : n+len(ens) : n+len(ens)]
		n += len(ens)
		for j, en := range ens {
			out[j].Key, cut = eventText(en.Key, events.MaxEnvoyKeyLen)
			c.Truncated = c.Truncated || cut
			out[j].Value, cut = eventText(en.Value, events.MaxEnvoyValueLen)
			c.Truncated = c.Truncated || cut
		}
		c.Descriptors[i].Entries = out
	}
	sc.used = n
	return c
}

// eventText makes s decision.v1 text of at most max characters: control
// characters and invalid UTF-8 become U+FFFD, the rest is cut, and an empty
// s is U+FFFD. It reports whether s was changed.
func eventText(s string, max int) (string, bool) {
	if s != "" && len(s) <= max && printableASCII(s) {
		return s, false // the common case: no allocation
	}
	if s == "" {
		return "\uFFFD", true
	}
	var b strings.Builder
	n := 0
	for _, r := range s { // invalid UTF-8 ranges as utf8.RuneError
		if n == max {
			break
		}
		if r < 0x20 || (r >= 0x7f && r <= 0x9f) {
			r = utf8.RuneError
		}
		b.WriteRune(r)
		n++
	}
	return b.String(), b.String() != s
}

func printableASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x7f {
			return false
		}
	}
	return true
}
