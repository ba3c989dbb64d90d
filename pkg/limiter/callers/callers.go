package callers

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
)

// Caller is an authenticated gateway and what it may claim in a check.
type Caller struct {
	Name string
	// MaxCost caps the cost of one check (0: the API's own 1..1,000,000).
	MaxCost int
	// Kinds are the principal kinds it may name (empty: any).
	Kinds []events.PrincipalKind
}

// Callers are the gateways allowed to ask for checks, by the SHA-256 of their
// bearer token (the token itself is never stored). Safe for concurrent use.
type Callers struct {
	byHash map[[32]byte]Caller
}

// ErrUnauthenticated is a check without a valid bearer token.
var ErrUnauthenticated = errors.New("a valid bearer token is required")

// ParseCallers reads FLOODGATE_LIMITER_CALLERS: comma-separated entries
// name:sha256[:max_cost[:kind+kind…]], e.g.
// "edge:9f86d0…:100:user+anonymous,partner:2c26b4…". Make a token and its
// hash with `openssl rand -hex 32 | tee token | tr -d '\n' | sha256sum`.
func ParseCallers(spec string) (*Callers, error) {
	c := &Callers{byHash: map[[32]byte]Caller{}}
	names := map[string]bool{}
	for i, entry := range strings.Split(spec, ",") {
		entry = strings.TrimSpace(entry)
		if entry == "" {
			continue
		}
		f := strings.Split(entry, ":")
		if len(f) < 2 || len(f) > 4 {
			return nil, fmt.Errorf("entry %d: want name:sha256[:max_cost[:kind+kind]]", i+1)
		}
		cl := Caller{Name: f[0]}
		if cl.Name == "" || len(cl.Name) > 64 || names[cl.Name] {
			return nil, fmt.Errorf("entry %d: name %q: 1-64 characters, unique", i+1, cl.Name)
		}
		names[cl.Name] = true
		sum, err := hex.DecodeString(f[1])
		if err != nil || len(sum) != 32 {
			return nil, fmt.Errorf("entry %d (%s): want the token's SHA-256 as 64 hex digits", i+1, cl.Name)
		}
		if len(f) > 2 && f[2] != "" {
			if cl.MaxCost, err = strconv.Atoi(f[2]); err != nil || cl.MaxCost < 1 || cl.MaxCost > 1_000_000 {
				return nil, fmt.Errorf("entry %d (%s): max_cost %q: 1..1000000", i+1, cl.Name, f[2])
			}
		}
		if len(f) > 3 {
			for _, k := range strings.Split(f[3], "+") {
				kind := events.PrincipalKind(k)
				if !kind.Valid() {
					return nil, fmt.Errorf("entry %d (%s): kind %q is not one of user|bot|api_key|anonymous", i+1, cl.Name, k)
				}
				cl.Kinds = append(cl.Kinds, kind)
			}
		}
		c.byHash[[32]byte(sum)] = cl
	}
	if len(c.byHash) == 0 {
		return nil, errors.New("no callers")
	}
	return c, nil
}

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

// Permit reports whether the caller may ask for req.
func (cl Caller) Permit(req *checkapi.CheckRequest) error {
	if cl.MaxCost > 0 && req.Cost > cl.MaxCost {
		return fmt.Errorf("cost %d: caller %s may ask for at most %d", req.Cost, cl.Name, cl.MaxCost)
	}
	if !cl.MayName(req.Principal.Kind) {
		return fmt.Errorf("principal kind %s: caller %s may not name it", req.Principal.Kind, cl.Name)
	}
	return nil
}

// MayName reports whether the caller may name principals of kind k.
func (cl Caller) MayName(k events.PrincipalKind) bool {
	return len(cl.Kinds) == 0 || slices.Contains(cl.Kinds, k)
}

type callerKey struct{}

// From is the authenticated caller of ctx (AuthInterceptor put it there), if any.
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
	return handler(context.WithValue(ctx, callerKey{}, cl), req)
}
