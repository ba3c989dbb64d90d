// Package api is the dead-letter auditor's authenticated HTTP API: list,
// inspect, replay, purge and the completeness check.
package api

import (
	"bufio"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/hex"
	"fmt"
	"io"
	"regexp"
	"strings"
)

// Roles. An sre can do everything a viewer can.
const (
	RoleViewer = "viewer" // list, inspect, completeness
	RoleSRE    = "sre"    // and replay, purge
)

// TokenPrefix starts every API token.
const TokenPrefix = "fgdlq_"

// Principal is an authenticated caller.
type Principal struct {
	Name string
	Role string
}

// Allows reports whether p may act with role.
func (p Principal) Allows(role string) bool {
	return p.Role == role || p.Role == RoleSRE && role == RoleViewer
}

// Tokens holds API tokens by their SHA-256; the tokens themselves are never
// stored. A token is 32 random bytes, so an unsalted hash is enough: there is
// nothing to guess from it. Immutable once loaded, so safe for concurrent use.
type Tokens struct {
	byHash map[string]Principal
}

var tokenName = regexp.MustCompile(`^[A-Za-z0-9._@-]{1,64}$`)

// HashToken returns the hex SHA-256 of token, as stored in the tokens file.
func HashToken(token string) string {
	sum := sha256.Sum256([]byte(token))
	return hex.EncodeToString(sum[:])
}

// NewToken returns a fresh random token and its tokens-file line.
func NewToken(name, role string) (token, line string, err error) {
	if !tokenName.MatchString(name) {
		return "", "", fmt.Errorf("token name %q: want 1-64 of [A-Za-z0-9._@-]", name)
	}
	if role != RoleViewer && role != RoleSRE {
		return "", "", fmt.Errorf("role %q is not one of %s|%s", role, RoleViewer, RoleSRE)
	}
	var b [32]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("generate token: %w", err)
	}
	token = TokenPrefix + base64.RawURLEncoding.EncodeToString(b[:])
	return token, fmt.Sprintf("%s %s %s", name, role, HashToken(token)), nil
}

// ParseTokens reads a tokens file: one "<name> <role> <sha256 hex>" per line;
// blank lines and lines starting with # are ignored. Errors name the line.
func ParseTokens(r io.Reader) (*Tokens, error) {
	t := &Tokens{byHash: map[string]Principal{}}
	sc := bufio.NewScanner(r)
	for n := 1; sc.Scan(); n++ {
		line := strings.TrimSpace(sc.Text())
		if line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		f := strings.Fields(line)
		if len(f) != 3 {
			return nil, fmt.Errorf("tokens line %d: want <name> <role> <sha256 hex>", n)
		}
		name, role, hash := f[0], f[1], strings.ToLower(f[2])
		if !tokenName.MatchString(name) {
			return nil, fmt.Errorf("tokens line %d: name %q: want 1-64 of [A-Za-z0-9._@-]", n, name)
		}
		if role != RoleViewer && role != RoleSRE {
			return nil, fmt.Errorf("tokens line %d: role %q is not one of %s|%s", n, role, RoleViewer, RoleSRE)
		}
		if raw, err := hex.DecodeString(hash); err != nil || len(raw) != sha256.Size {
			return nil, fmt.Errorf("tokens line %d: %q is not a hex SHA-256", n, f[2])
		}
		if _, dup := t.byHash[hash]; dup {
			return nil, fmt.Errorf("tokens line %d: the same token is listed twice", n)
		}
		t.byHash[hash] = Principal{Name: name, Role: role}
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read tokens: %w", err)
	}
	return t, nil
}

// Lookup returns the principal of token.
func (t *Tokens) Lookup(token string) (Principal, bool) {
	if t == nil || !strings.HasPrefix(token, TokenPrefix) {
		return Principal{}, false
	}
	p, ok := t.byHash[HashToken(token)]
	return p, ok
}

// Len is the number of tokens.
func (t *Tokens) Len() int {
	if t == nil {
		return 0
	}
	return len(t.byHash)
}
