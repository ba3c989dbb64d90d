package callers

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strconv"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
)

// Caller is an authenticated gateway and what it may claim in a check.
type Caller struct {
	Name string
	// MaxCost caps the cost of one check (0: the API's own 1..1,000,000).
	MaxCost int
	// Kinds are the principal kinds it may name (empty: any).
	Kinds []events.PrincipalKind
	// IDs are the principal ids it may name, each exact or, ending in '*',
	// a prefix — a tenant's namespace such as "acme-*" (empty: any).
	IDs []string
	// Routes are the routes it may ask about, each exact or, ending in '*',
	// a prefix such as "/v1/*" (empty: any).
	Routes []string

	refused *prometheus.CounterVec // the Callers' floodgate_limiter_forbidden_total
}

// Callers are the gateways allowed to ask for checks, by the SHA-256 of their
// bearer token (the token itself is never stored). A Callers is a
// prometheus.Collector of floodgate_limiter_forbidden_total{caller,reason}:
// checks refused because they claimed beyond their caller's grant. Safe for
// concurrent use.
type Callers struct {
	byHash  map[[32]byte]Caller
	refused *prometheus.CounterVec
	legacy  bool
}

var _ prometheus.Collector = (*Callers)(nil)

// ErrUnauthenticated is a check without a valid bearer token.
var ErrUnauthenticated = errors.New("a valid bearer token is required")

// ScopeError is a check claiming beyond its caller's grant: Reason is cost,
// kind, principal or route.
type ScopeError struct {
	Caller, Reason, Detail string
}

func (e *ScopeError) Error() string { return e.Detail }

// RoleGateway is the one role of the limiter's callers: a gateway asking
// for checks within its grant.
const RoleGateway = "gateway"

// ParseCallers reads FLOODGATE_LIMITER_CALLERS, a token spec (pkg/httpapi)
// whose entries carry the caller's grant after the hash:
// name:gateway:sha256hex[:max_cost[:kind+kind…[:id+id…[:route+route…]]]], e.g.
// "edge:gateway:9f86d0…:100:user+anonymous,partner:gateway:2c26b4…:100:api_key:acme-*:/v1/*".
// An id or route ending in '*' is a prefix; ids and routes are
// percent-encoded where they hold ',', ':', '+', '*' or '%' (a route's own
// percent-encoding doubled: %2525). An empty field grants any. Make a token
// and its hash with `openssl rand -hex 32 | tee token | tr -d '\n' | sha256sum`.
//
// The former entries without the role, name:sha256hex[:…], are still read
// for one release; Legacy reports them.
func ParseCallers(spec string) (*Callers, error) {
	c := &Callers{byHash: map[[32]byte]Caller{}, refused: prometheus.NewCounterVec(prometheus.CounterOpts{
		Name: "floodgate_limiter_forbidden_total",
		Help: "Checks refused (403, no decision) for claiming beyond their caller's grant, by caller and reason (cost, kind, principal, route).",
	}, []string{"caller", "reason"})}
	spec, c.legacy = withRoles(spec)
	entries, err := httpapi.ParseTokenEntries(httpapi.Roles{RoleGateway}, spec, 4)
	if err != nil {
		return nil, err
	}
	for i, en := range entries {
		cl := Caller{Name: en.Name, refused: c.refused}
		f := en.Extra
		if len(f) > 0 && f[0] != "" {
			if cl.MaxCost, err = strconv.Atoi(f[0]); err != nil || cl.MaxCost < 1 || cl.MaxCost > 1_000_000 {
				return nil, fmt.Errorf("entry %d (%s): max_cost %q: 1..1000000", i+1, cl.Name, f[0])
			}
		}
		if len(f) > 1 && f[1] != "" {
			for _, k := range strings.Split(f[1], "+") {
				kind := events.PrincipalKind(k)
				if !kind.Valid() {
					return nil, fmt.Errorf("entry %d (%s): kind %q is not one of user|bot|api_key|anonymous", i+1, cl.Name, k)
				}
				cl.Kinds = append(cl.Kinds, kind)
			}
		}
		if len(f) > 2 {
			if cl.IDs, err = scopeList(f[2]); err != nil {
				return nil, fmt.Errorf("entry %d (%s): ids: %w", i+1, cl.Name, err)
			}
		}
		if len(f) > 3 {
			if cl.Routes, err = scopeList(f[3]); err != nil {
				return nil, fmt.Errorf("entry %d (%s): routes: %w", i+1, cl.Name, err)
			}
		}
		c.byHash[en.Hash] = cl
	}
	if len(c.byHash) == 0 {
		return nil, errors.New("no callers")
	}
	return c, nil
}

// Legacy reports whether the spec held entries of the former form,
// name:sha256hex[:…] (no role), read for one release only.
func (c *Callers) Legacy() bool { return c != nil && c.legacy }

// withRoles rewrites entries of the former form name:sha256hex[:…] as
// name:gateway:sha256hex[:…]: a second field of 64 hex digits is a hash,
// never a role.
func withRoles(spec string) (string, bool) {
	var out []string
	legacy := false
	for _, line := range strings.Split(spec, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, item := range strings.Split(line, ",") {
			if f := strings.SplitN(strings.TrimSpace(item), ":", 3); len(f) >= 2 && isHash(f[1]) {
				item, legacy = f[0]+":"+RoleGateway+":"+strings.Join(f[1:], ":"), true
			}
			out = append(out, item)
		}
	}
	return strings.Join(out, ","), legacy
}

func isHash(s string) bool {
	b, err := hex.DecodeString(s)
	return err == nil && len(b) == sha256.Size
}

// scopeList reads '+'-separated, percent-encoded patterns; a pattern whose
// last character is an unencoded '*' is a prefix (kept with its '*').
func scopeList(field string) ([]string, error) {
	if field == "" {
		return nil, nil
	}
	var out []string
	for _, raw := range strings.Split(field, "+") {
		body, prefix := strings.CutSuffix(raw, "*")
		if strings.Contains(body, "*") {
			return nil, fmt.Errorf("%q: '*' only at the end (a prefix); write a literal one as %%2A", raw)
		}
		v, err := url.PathUnescape(body)
		if err != nil || (v == "" && !prefix) {
			return nil, fmt.Errorf("%q: want a non-empty, percent-encoded value", raw)
		}
		if prefix {
			v += "*"
		}
		out = append(out, v)
	}
	return out, nil
}

// inScope reports whether v is one of patterns (any when there are none).
// A pattern ending in '*' is a prefix; other patterns must equal v — a
// literal '*' at the end of a value is matched by its prefix pattern only.
func inScope(patterns []string, v string) bool {
	if len(patterns) == 0 {
		return true
	}
	for _, p := range patterns {
		if pre, ok := strings.CutSuffix(p, "*"); ok {
			if strings.HasPrefix(v, pre) {
				return true
			}
		} else if p == v {
			return true
		}
	}
	return false
}

// Describe implements prometheus.Collector.
func (c *Callers) Describe(ch chan<- *prometheus.Desc) { c.refused.Describe(ch) }

// Collect implements prometheus.Collector.
func (c *Callers) Collect(ch chan<- prometheus.Metric) { c.refused.Collect(ch) }

// Authenticate returns the caller of an Authorization header value
// ("Bearer <token>").
func (c *Callers) Authenticate(authorization string) (Caller, error) {
	tok, ok := strings.CutPrefix(authorization, "Bearer ")
	if !ok || tok == "" {
		return Caller{}, ErrUnauthenticated
	}
	sum := sha256.Sum256([]byte(tok))
	for h, cl := range c.byHash { // every entry compared, in constant time
		if subtle.ConstantTimeCompare(h[:], sum[:]) == 1 {
			return cl, nil
		}
	}
	return Caller{}, ErrUnauthenticated
}

// Permit reports whether the caller may ask for req: a *ScopeError, counted,
// when req claims a cost, a principal or a route beyond the caller's grant.
func (cl Caller) Permit(req *checkapi.CheckRequest) error {
	if cl.MaxCost > 0 && req.Cost > cl.MaxCost {
		return cl.refuse("cost", fmt.Sprintf("cost %d: caller %s may ask for at most %d", req.Cost, cl.Name, cl.MaxCost))
	}
	if err := cl.PermitPrincipal(req.Principal); err != nil {
		return err
	}
	if !inScope(cl.Routes, req.Route) {
		return cl.refuse("route", fmt.Sprintf("route %q: outside the routes caller %s may ask about", req.Route, cl.Name))
	}
	return nil
}

// PermitPrincipal is Permit for a call that names only a principal (an Envoy
// descriptor tree of a configured domain): its kind and id.
func (cl Caller) PermitPrincipal(p events.Principal) error {
	switch {
	case !cl.MayName(p.Kind):
		return cl.refuse("kind", fmt.Sprintf("principal kind %s: caller %s may not name it", p.Kind, cl.Name))
	case !inScope(cl.IDs, p.ID):
		return cl.refuse("principal", fmt.Sprintf("principal %s %q: outside the ids caller %s may name", p.Kind, p.ID, cl.Name))
	}
	return nil
}

// refuse counts a refusal of the caller for reason and returns it.
func (cl Caller) refuse(reason, detail string) error {
	if cl.refused != nil {
		cl.refused.WithLabelValues(cl.Name, reason).Inc()
	}
	return &ScopeError{Caller: cl.Name, Reason: reason, Detail: detail}
}

// MayName reports whether the caller may name principals of kind k.
func (cl Caller) MayName(k events.PrincipalKind) bool {
	return len(cl.Kinds) == 0 || slices.Contains(cl.Kinds, k)
}

type callerKey struct{}

// NewContext is ctx carrying cl, an authenticated caller.
func NewContext(ctx context.Context, cl Caller) context.Context {
	return context.WithValue(ctx, callerKey{}, cl)
}

// From is the authenticated caller of ctx (AuthInterceptor or NewContext put
// it there), if any.
func From(ctx context.Context) (Caller, bool) {
	cl, ok := ctx.Value(callerKey{}).(Caller)
	return cl, ok
}

// AuthInterceptor authenticates every gRPC call by its "authorization"
// metadata (Envoy sends it with grpc_service.initial_metadata).
func (c *Callers) AuthInterceptor(ctx context.Context, req any, info *grpc.UnaryServerInfo, handler grpc.UnaryHandler) (any, error) {
	if info.FullMethod == "/grpc.health.v1.Health/Check" {
		return handler(ctx, req)
	}
	md, _ := metadata.FromIncomingContext(ctx)
	auth := ""
	if v := md.Get("authorization"); len(v) > 0 {
		auth = v[0]
	}
	cl, err := c.Authenticate(auth)
	if err != nil {
		return nil, status.Error(codes.Unauthenticated, err.Error())
	}
	return handler(NewContext(ctx, cl), req)
}
