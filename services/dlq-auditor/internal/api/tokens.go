// Package api is the dead-letter auditor's authenticated HTTP API: list,
// inspect, replay, purge and the completeness check.
package api

import (
	"fmt"
	"strings"

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

// HashToken returns the hex SHA-256 of a token, as the token spec stores it.
func HashToken(token string) string { return httpapi.HashToken(token) }

// NewToken returns a fresh random token and its token-spec entry
// (name:role:sha256hex) for FLOODGATE_DLQ_TOKENS or its file.
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
	return token, httpapi.TokenSpecEntry(name, role, token), nil
}

// ParseTokens reads FLOODGATE_DLQ_TOKENS (or the file FLOODGATE_DLQ_TOKENS_FILE
// names): a token spec (pkg/httpapi), name:role:sha256hex entries one a line
// or comma-separated. legacy reports the former file form, one
// "<name> <role> <sha256 hex>" a line, still read for one release: entries
// without a single ':' are.
func ParseTokens(spec string) (t *Tokens, legacy bool, err error) {
	var set *httpapi.Tokens
	if legacy = isLegacy(spec); legacy {
		set, err = httpapi.ParseLegacyTokenFile(roles(), strings.NewReader(spec))
	} else {
		set, err = httpapi.ParseTokenSpec(roles(), spec)
	}
	if err != nil {
		return nil, legacy, err
	}
	return &Tokens{set: set}, legacy, nil
}

// isLegacy: some line, not blank nor a comment, and none holds a ':'.
func isLegacy(spec string) bool {
	some := false
	for _, line := range strings.Split(spec, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		if strings.Contains(line, ":") {
			return false
		}
		some = true
	}
	return some
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
