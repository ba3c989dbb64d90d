// Package api is the dead-letter auditor's authenticated HTTP API: list,
// inspect, replay, purge and the completeness check.
package api

import (
	"fmt"
	"io"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
)

// Roles. An sre can do everything a viewer can.
const (
	RoleViewer = "viewer" // list, inspect, completeness
	RoleSRE    = "sre"    // and replay, purge
)

// roles orders the API's roles, least privileged first.
func roles() httpapi.Roles { return httpapi.Roles{RoleViewer, RoleSRE} }

// TokenPrefix starts every API token.
const TokenPrefix = "fgdlq_"

// Principal is an authenticated caller.
type Principal = httpapi.Caller

// Allows reports whether a caller with role have may act with role need.
func Allows(have, need string) bool { return roles().Allows(have, need) }

// Tokens holds API tokens by their SHA-256 (pkg/httpapi); the tokens
// themselves are never stored. Immutable once loaded, so safe for concurrent use.
type Tokens struct{ set *httpapi.Tokens }

// HashToken returns the hex SHA-256 of token, as stored in the tokens file.
func HashToken(token string) string { return httpapi.HashToken(token) }

// NewToken returns a fresh random token and its tokens-file line.
func NewToken(name, role string) (token, line string, err error) {
	if !httpapi.ValidTokenName(name) {
		return "", "", fmt.Errorf("token name %q: want 1-64 of [A-Za-z0-9._@-]", name)
	}
	if !roles().Valid(role) {
		return "", "", fmt.Errorf("role %q is not one of %s|%s", role, RoleViewer, RoleSRE)
	}
	if token, err = httpapi.NewToken(TokenPrefix); err != nil {
		return "", "", err
	}
	return token, fmt.Sprintf("%s %s %s", name, role, HashToken(token)), nil
}

// ParseTokens reads a tokens file: one "<name> <role> <sha256 hex>" per line;
// blank lines and lines starting with # are ignored. Errors name the line.
func ParseTokens(r io.Reader) (*Tokens, error) {
	set, err := httpapi.ParseTokenFile(roles(), r)
	if err != nil {
		return nil, err
	}
	return &Tokens{set: set}, nil
}

// Lookup returns the principal of token (constant-time, pkg/httpapi).
func (t *Tokens) Lookup(token string) (Principal, bool) {
	if t == nil {
		return Principal{}, false
	}
	tok, ok := t.set.Lookup(token)
	return Principal{Name: tok.Name, Role: tok.Role}, ok
}

// Len is the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return t.set.Len()
}

func (t *Tokens) httpapi() *httpapi.Tokens {
	if t == nil {
		return nil
	}
	return t.set
}
