// Package admin is the adjuster's authenticated admin API: SREs read and
// change thresholds, dry-run, the kill switch and overrides; viewers read.
// Every change is validated, based on a version the caller has seen (If-Match)
// and written together with its audit record.
package admin

import (
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"strings"
)

// Roles. An sre can do everything a viewer can.
const (
	RoleViewer = "viewer"
	RoleSRE    = "sre"
)

// Token is one API token, kept only as its SHA-256 hash. Tokens are 256-bit
// random strings (NewToken), so a fast hash is enough: there is nothing to
// brute-force, unlike a password.
type Token struct {
	Name string
	Role string
	Hash [sha256.Size]byte
}

// ParseTokens reads FLOODGATE_ADJUSTER_TOKENS: comma-separated
// name:role:sha256hex entries, e.g. "alice:sre:9f86d0…,dash:viewer:60303a…".
func ParseTokens(spec string) ([]Token, error) {
	var out []Token
	var errs []error
	names := map[string]bool{}
	for i, item := range strings.Split(spec, ",") {
		item = strings.TrimSpace(item)
		if item == "" {
			continue
		}
		parts := strings.Split(item, ":")
		if len(parts) != 3 {
			errs = append(errs, fmt.Errorf("token %d: want name:role:sha256hex", i))
			continue
		}
		name, role, hexHash := parts[0], parts[1], parts[2]
		if name == "" || len(name) > 64 || strings.ContainsAny(name, " \t#") {
			errs = append(errs, fmt.Errorf("token %d: name %q must be 1-64 characters without spaces or #", i, name))
		}
		if names[name] {
			errs = append(errs, fmt.Errorf("token %d: name %q appears twice", i, name))
		}
		names[name] = true
		if role != RoleSRE && role != RoleViewer {
			errs = append(errs, fmt.Errorf("token %d (%s): role %q is not one of sre|viewer", i, name, role))
		}
		raw, err := hex.DecodeString(hexHash)
		if err != nil || len(raw) != sha256.Size {
			errs = append(errs, fmt.Errorf("token %d (%s): hash must be 64 hex digits (sha256 of the token)", i, name))
			continue
		}
		t := Token{Name: name, Role: role}
		copy(t.Hash[:], raw)
		out = append(out, t)
	}
	return out, errors.Join(errs...)
}

// HashToken returns the hex SHA-256 of a token, as FLOODGATE_ADJUSTER_TOKENS stores it.
func HashToken(token string) string {
	h := sha256.Sum256([]byte(token))
	return hex.EncodeToString(h[:])
}

// NewToken returns a fresh random token ("fga_" + 43 base64url characters).
func NewToken() (string, error) {
	b := make([]byte, 32)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("generate token: %w", err)
	}
	return "fga_" + base64.RawURLEncoding.EncodeToString(b), nil
}

// authenticate finds the token's owner; it compares against every token in
// constant time so timing reveals nothing about which hash was close.
func authenticate(tokens []Token, presented string) (Token, bool) {
	h := sha256.Sum256([]byte(presented))
	var found Token
	ok := 0
	for _, t := range tokens {
		if subtle.ConstantTimeCompare(h[:], t.Hash[:]) == 1 {
			found, ok = t, 1
		}
	}
	return found, ok == 1
}

func allowed(have, need string) bool {
	return need == RoleViewer && (have == RoleViewer || have == RoleSRE) || need == RoleSRE && have == RoleSRE
}
