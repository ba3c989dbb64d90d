package httpapi

import (
	"bufio"
	"errors"
	"fmt"
	"io"
	"slices"
	"strings"
)

// A token spec lists the callers of one API, in one format for every
// Floodgate service (FLOODGATE_ADJUSTER_TOKENS, FLOODGATE_QUOTA_TOKENS,
// FLOODGATE_DLQ_TOKENS, FLOODGATE_LIMITER_CALLERS, the console's users file):
// entries
//
//	name:role:sha256hex
//
// separated by commas or newlines; blank lines and lines starting with # are
// skipped. name is 1-64 of [A-Za-z0-9._@-], role one of the service's roles,
// sha256hex the hex SHA-256 of the token (the token itself is never stored).
// A service may allow fields of its own after the hash (the limiter's grant:
// name:gateway:sha256hex:max_cost:kinds:ids:routes).

// TokenEntry is one entry of a token spec.
type TokenEntry struct {
	Token
	// Extra are the fields after the hash, for a service that allows them.
	Extra []string
}

// TokenSpecEntry returns the spec entry of a token: name:role:sha256hex.
func TokenSpecEntry(name, role, token string) string {
	return name + ":" + role + ":" + HashToken(token)
}

// ParseTokenSpec reads a token spec with no fields after the hash.
func ParseTokenSpec(roles Roles, spec string) (*Tokens, error) {
	entries, err := ParseTokenEntries(roles, spec, 0)
	if err != nil {
		return nil, err
	}
	list := make([]Token, len(entries))
	for i, e := range entries {
		list[i] = e.Token
	}
	return NewTokens(roles, list)
}

// ParseTokenEntries reads a token spec whose entries may hold up to extra
// fields after the hash. It checks every entry (name, role, hash, no name or
// token twice) and reports every problem, each naming its entry.
func ParseTokenEntries(roles Roles, spec string, extra int) ([]TokenEntry, error) {
	var entries []TokenEntry
	var errs []error
	n := 0
	for _, line := range strings.Split(spec, "\n") {
		if line = strings.TrimSpace(line); line == "" || strings.HasPrefix(line, "#") {
			continue
		}
		for _, item := range strings.Split(line, ",") {
			if item = strings.TrimSpace(item); item == "" {
				continue
			}
			n++
			f := strings.Split(item, ":")
			if len(f) < 3 || len(f) > 3+extra {
				want := "name:role:sha256hex"
				if extra > 0 {
					want += fmt.Sprintf(" and up to %d fields of its own", extra)
				}
				errs = append(errs, fmt.Errorf("entry %d: want %s", n, want))
				continue
			}
			h, ok := parseHash(f[2])
			if !ok {
				errs = append(errs, fmt.Errorf("entry %d (%s): hash must be 64 hex digits (sha256 of the token)", n, f[0]))
				continue
			}
			entries = append(entries, TokenEntry{Token: Token{Name: f[0], Role: f[1], Hash: h}, Extra: f[3:]})
		}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	list := make([]Token, len(entries))
	for i, e := range entries {
		list[i] = e.Token
	}
	if _, err := NewTokens(roles, list); err != nil { // every entry parsed: its index is its number
		return nil, err
	}
	return entries, nil
}

// ParseLegacyTokenFile reads the dlq-auditor's former tokens file: one
// "<name> <role> <sha256 hex>" per line; blank lines and lines starting with #
// are skipped. Errors name the line.
//
// Deprecated: read for one release so that existing files keep working;
// write a token spec (ParseTokenSpec) instead.
func ParseLegacyTokenFile(roles Roles, r io.Reader) (*Tokens, error) {
	var list []Token
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
		if !ValidTokenName(f[0]) {
			return nil, fmt.Errorf("tokens line %d: name %q: want 1-64 of [A-Za-z0-9._@-]", n, f[0])
		}
		if !roles.Valid(f[1]) {
			return nil, fmt.Errorf("tokens line %d: role %q is not one of %s", n, f[1], strings.Join(roles, "|"))
		}
		h, ok := parseHash(f[2])
		if !ok {
			return nil, fmt.Errorf("tokens line %d: %q is not a hex SHA-256", n, f[2])
		}
		if slices.ContainsFunc(list, func(t Token) bool { return t.Hash == h }) {
			return nil, fmt.Errorf("tokens line %d: the same token is listed twice", n)
		}
		list = append(list, Token{Name: f[0], Role: f[1], Hash: h})
	}
	if err := sc.Err(); err != nil {
		return nil, fmt.Errorf("read tokens: %w", err)
	}
	return NewTokens(roles, list)
}
