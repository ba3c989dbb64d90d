package httpapi

import (
	"context"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"slices"
	"strings"
	"time"
)

// Token is one API token, kept only as its SHA-256. Tokens are 256-bit random
// strings (NewToken), so an unsalted fast hash is enough: there is nothing to
// brute-force, unlike a password.
type Token struct {
	Name string
	Role string
	Hash [sha256.Size]byte
}

// Roles lists a service's roles from least to most privileged; a role allows
// everything the roles before it allow.
type Roles []string

// Allows reports whether have may act where need is required.
func (rs Roles) Allows(have, need string) bool {
	h, n := slices.Index(rs, have), slices.Index(rs, need)
	return h >= 0 && n >= 0 && h >= n
}

// Valid reports whether role is one of rs.
func (rs Roles) Valid(role string) bool { return slices.Contains(rs, role) }

// HashToken is the hex SHA-256 of a token, as token lists store it.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// NewToken returns prefix followed by 32 random bytes in base64url.
func NewToken(prefix string) (string, error) {
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return prefix + base64.RawURLEncoding.EncodeToString(b[:]), nil
}

// ValidTokenName: 1-64 of [A-Za-z0-9._@-].
func ValidTokenName(name string) bool {
	if name == "" || len(name) > 64 {
		return false
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._@-", c) >= 0) {
			return false
		}
	}
	return true
}

// Tokens is an immutable set of API tokens; safe for concurrent use.
type Tokens struct{ list []Token }

// NewTokens checks the entries (names, roles, no name or hash twice).
func NewTokens(roles Roles, list []Token) (*Tokens, error) {
	var errs []error
	names := map[string]bool{}
	hashes := map[[sha256.Size]byte]bool{}
	for i, t := range list {
		if !ValidTokenName(t.Name) {
			errs = append(errs, fmt.Errorf("entry %d: name %q: want 1-64 of [A-Za-z0-9._@-]", i+1, t.Name))
		}
		if names[t.Name] {
			errs = append(errs, fmt.Errorf("entry %d: name %q appears twice", i+1, t.Name))
		}
		if hashes[t.Hash] {
			errs = append(errs, fmt.Errorf("entry %d (%s): the same token is listed twice", i+1, t.Name))
		}
		if !roles.Valid(t.Role) {
			errs = append(errs, fmt.Errorf("entry %d (%s): role %q is not one of %s", i+1, t.Name, t.Role, strings.Join(roles, "|")))
		}
		names[t.Name], hashes[t.Hash] = true, true
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return &Tokens{list: slices.Clone(list)}, nil
}

func parseHash(s string) ([sha256.Size]byte, bool) {
	var h [sha256.Size]byte
	raw, err := hex.DecodeString(strings.ToLower(s))
	if err != nil || len(raw) != sha256.Size {
		return h, false
	}
	copy(h[:], raw)
	return h, true
}

// Len is the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.list)
}

// Lookup finds presented's owner. It compares with every stored hash in
// constant time, so timing tells nothing about which hash was close.
func (t *Tokens) Lookup(presented string) (Token, bool) {
	if t == nil || presented == "" {
		return Token{}, false
	}
	h := sha256.Sum256([]byte(presented))
	var found Token
	ok := 0
	for _, c := range t.list {
		if subtle.ConstantTimeCompare(h[:], c.Hash[:]) == 1 {
			found, ok = c, 1
		}
	}
	return found, ok == 1
}

// Caller is an authenticated API caller.
type Caller struct {
	Name string
	Role string
}

type callerKey struct{}

// CallerFrom returns the caller Auth put in ctx.
func CallerFrom(ctx context.Context) (Caller, bool) {
	c, ok := ctx.Value(callerKey{}).(Caller)
	return c, ok
}

// AuthOutcome says how an authentication ended.
type AuthOutcome string

// Outcomes of one authentication.
const (
	AuthAllowed         AuthOutcome = "allowed"
	AuthUnauthenticated AuthOutcome = "unauthenticated"
	AuthForbidden       AuthOutcome = "forbidden"
)

// AuthEvent is one authentication, handed to the audit hook.
type AuthEvent struct {
	At        time.Time
	RequestID string
	Method    string
	Path      string
	Route     string // the route's name, as given to Require
	Caller    Caller // empty when unauthenticated
	Need      string // the role the route needs
	Outcome   AuthOutcome
}

// Auth is the bearer-token middleware of an admin API.
type Auth struct {
	Tokens *Tokens
	Roles  Roles
	Realm  string // WWW-Authenticate realm, e.g. "floodgate-adjuster"
	// Audit, if set, sees every authentication, allowed or not. It runs on
	// the request's goroutine and must not block.
	Audit func(ctx context.Context, e AuthEvent)
	Now   func() time.Time
}

// BearerToken returns the token of an "Authorization: Bearer <token>" value.
func BearerToken(header string) string {
	scheme, tok, ok := strings.Cut(strings.TrimSpace(header), " ")
	if !ok || !strings.EqualFold(scheme, "Bearer") {
		return ""
	}
	return strings.TrimSpace(tok)
}

// Require serves next only to a caller whose token's role allows need; the
// caller is in the request's context (CallerFrom). Others get 401 or 403
// as problems.
func (a *Auth) Require(route, need string, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		ev := AuthEvent{RequestID: RequestID(r.Context()), Method: r.Method, Path: r.URL.Path, Route: route, Need: need}
		if a.Now != nil {
			ev.At = a.Now()
		} else {
			ev.At = time.Now()
		}
		tok, ok := a.Tokens.Lookup(BearerToken(r.Header.Get("Authorization")))
		switch {
		case !ok:
			ev.Outcome = AuthUnauthenticated
			a.audit(r.Context(), ev)
			w.Header().Set("WWW-Authenticate", `Bearer realm="`+a.Realm+`"`)
			WriteProblem(w, r, Problem{Type: ProblemUnauthenticated, Status: http.StatusUnauthorized,
				Detail: "a valid API token is required: Authorization: Bearer <token>"})
			return
		case !a.Roles.Allows(tok.Role, need):
			ev.Caller, ev.Outcome = Caller{Name: tok.Name, Role: tok.Role}, AuthForbidden
			a.audit(r.Context(), ev)
			WriteProblem(w, r, Problem{Type: ProblemForbidden, Status: http.StatusForbidden,
				Detail: fmt.Sprintf("role %s may not %s; it needs role %s", tok.Role, route, need)})
			return
		}
		ev.Caller, ev.Outcome = Caller{Name: tok.Name, Role: tok.Role}, AuthAllowed
		a.audit(r.Context(), ev)
		if info, ok := r.Context().Value(requestIDKey{}).(*requestInfo); ok {
			info.caller = ev.Caller // for the access log
		}
		next.ServeHTTP(w, r.WithContext(context.WithValue(r.Context(), callerKey{}, ev.Caller)))
	})
}

func (a *Auth) audit(ctx context.Context, e AuthEvent) {
	if a.Audit != nil {
		a.Audit(ctx, e)
	}
}
