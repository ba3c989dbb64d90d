// Package auth holds the console's identities: locally configured users with
// bcrypt password hashes, API tokens stored as SHA-256, the role order, and
// server-side sessions with their CSRF tokens.
package auth

import (
	"bytes"
	"crypto/rand"
	"crypto/sha256"
	"crypto/subtle"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"os"
	"regexp"
	"strings"

	"go.yaml.in/yaml/v3"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"golang.org/x/crypto/bcrypt"
)

// Role orders what a principal of the console may do: each role may do what
// the roles before it may.
type Role int

// The roles, weakest first.
const (
	RoleNone    Role = iota
	RoleViewer       // reads every page
	RoleAnalyst      // trust-and-safety: lifts and extends penalties, allowlists, marks false positives
	RoleSRE          // pipeline settings
	RoleAdmin        // everything
)

var roleNames = []string{"", "viewer", "analyst", "sre", "admin"}

// ParseRole reads a role name.
func ParseRole(s string) (Role, error) {
	for i, n := range roleNames {
		if i > 0 && n == s {
			return Role(i), nil
		}
	}
	return RoleNone, fmt.Errorf("role %q is not one of viewer|analyst|sre|admin", s)
}

func (r Role) String() string {
	if r <= RoleNone || int(r) >= len(roleNames) {
		return "none"
	}
	return roleNames[r]
}

// Allows reports whether r includes need.
func (r Role) Allows(need Role) bool { return r >= need }

// Identity is who made a request.
type Identity struct {
	Name string
	Role Role
	Via  string // "session" or "token"
	// Generation names the user's credentials as the users file has them
	// now (a digest of the password hash and the role): it changes when the
	// password or the role does, which ends every session started under the
	// previous one. Empty for tokens.
	Generation string
}

// MinPasswordLen is the shortest password `console user add` accepts.
const MinPasswordLen = 12

var nameRE = regexp.MustCompile(`^[A-Za-z0-9][A-Za-z0-9._@-]{0,63}$`)

// ValidName reports whether s can name a user or a token.
func ValidName(s string) bool { return nameRE.MatchString(s) }

// User is one entry of the users file.
type User struct {
	Name         string `yaml:"name"`
	Role         string `yaml:"role"`
	PasswordHash string `yaml:"password_hash"`
}

// Token is one API token of the users file; only its SHA-256 is stored. In
// the file it is a token-spec entry (pkg/httpapi), as every Floodgate
// service lists its callers: "name:role:sha256hex". The former mapping
// {name, role, sha256} is still read for one release (Directory.LegacyTokens).
type Token struct {
	Name   string
	Role   string
	SHA256 string

	spec   string // the entry as the file has it
	legacy bool   // written as the former mapping
}

// UnmarshalYAML reads a token-spec entry, or the former mapping.
func (t *Token) UnmarshalYAML(n *yaml.Node) error {
	switch n.Kind {
	case yaml.ScalarNode:
		*t = Token{spec: n.Value}
		return nil
	case yaml.MappingNode:
		var m struct {
			Name   string `yaml:"name"`
			Role   string `yaml:"role"`
			SHA256 string `yaml:"sha256"`
		}
		if err := n.Decode(&m); err != nil {
			return err
		}
		*t = Token{Name: m.Name, Role: m.Role, SHA256: m.SHA256, legacy: true}
		return nil
	}
	return fmt.Errorf("line %d: a token is \"name:role:sha256hex\"", n.Line)
}

// MarshalYAML writes the token-spec entry.
func (t Token) MarshalYAML() (any, error) { return t.entry(), nil }

func (t Token) entry() string {
	if t.spec != "" {
		return t.spec
	}
	return t.Name + ":" + t.Role + ":" + t.SHA256
}

// tokenRoles are the roles a token may have, in the order of Role.
func tokenRoles() httpapi.Roles { return httpapi.Roles(roleNames[1:]) }

// File is the users file (YAML).
type File struct {
	Users  []User  `yaml:"users"`
	Tokens []Token `yaml:"tokens"`
}

// Directory answers who a password or a token belongs to. Safe for concurrent
// use (read-only after Load).
type Directory struct {
	users  map[string]user
	tokens map[[32]byte]Identity
	dummy  []byte // a hash to compare against for unknown users (same timing)
	legacy bool   // some token written as the former mapping
}

// LegacyTokens reports tokens written as the former mapping {name, role,
// sha256}, read for one release only.
func (d *Directory) LegacyTokens() bool { return d.legacy }

type user struct {
	hash []byte
	role Role
	gen  string
}

// generation digests what a session was granted under: the user's name,
// password hash and role. SHA-256 over a salted bcrypt hash reveals nothing
// a guesser can use.
func generation(name, hash string, role Role) string {
	m := sha256.New()
	for _, p := range []string{"user-generation", name, hash, role.String()} {
		_, _ = fmt.Fprintf(m, "%d:%s", len(p), p)
	}
	return hex.EncodeToString(m.Sum(nil)[:16])
}

// LoadFile reads and validates the users file at path.
func LoadFile(path string) (*Directory, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("read users file: %w", err)
	}
	return Parse(raw)
}

// Parse validates a users file's content.
func Parse(raw []byte) (*Directory, error) {
	var f File
	dec := yaml.NewDecoder(bytes.NewReader(raw))
	dec.KnownFields(true)
	if err := dec.Decode(&f); err != nil && !errors.Is(err, io.EOF) {
		return nil, fmt.Errorf("parse users file: %w", err)
	}
	return NewDirectory(f)
}

// checkEntry checks the name and role of entry i of list ("users" or
// "tokens"), adding what is wrong to errs, and returns the role.
func checkEntry(errs *[]error, list string, i int, name, role string) Role {
	r, err := ParseRole(role)
	if err != nil {
		*errs = append(*errs, fmt.Errorf("%s[%d].role: %w", list, i, err))
	}
	if !ValidName(name) {
		*errs = append(*errs, fmt.Errorf("%s[%d].name: %q must be 1-64 of [A-Za-z0-9._@-]", list, i, name))
	}
	return r
}

// NewDirectory validates f and indexes it.
func NewDirectory(f File) (*Directory, error) {
	d := &Directory{users: map[string]user{}, tokens: map[[32]byte]Identity{}}
	var errs []error
	for i, u := range f.Users {
		role := checkEntry(&errs, "users", i, u.Name, u.Role)
		if _, dup := d.users[u.Name]; dup {
			errs = append(errs, fmt.Errorf("users[%d].name: %q appears twice", i, u.Name))
		}
		if _, err := bcrypt.Cost([]byte(u.PasswordHash)); err != nil {
			errs = append(errs, fmt.Errorf("users[%d].password_hash: not a bcrypt hash (make one with `console user add`)", i))
		}
		d.users[u.Name] = user{hash: []byte(u.PasswordHash), role: role, gen: generation(u.Name, u.PasswordHash, role)}
	}
	spec := make([]string, len(f.Tokens))
	for i, t := range f.Tokens {
		spec[i], d.legacy = t.entry(), d.legacy || t.legacy
	}
	entries, err := httpapi.ParseTokenEntries(tokenRoles(), strings.Join(spec, "\n"), 0)
	if err != nil {
		errs = append(errs, fmt.Errorf("tokens: %w", err))
	}
	for _, t := range entries {
		role, _ := ParseRole(t.Role) // ParseTokenEntries checked it
		d.tokens[t.Hash] = Identity{Name: t.Name, Role: role, Via: "token"}
	}
	if err := errors.Join(errs...); err != nil {
		return nil, fmt.Errorf("users file: %w", err)
	}
	dummy, err := bcrypt.GenerateFromPassword([]byte("floodgate-console-dummy"), bcrypt.DefaultCost)
	if err != nil {
		return nil, fmt.Errorf("hash dummy password: %w", err)
	}
	d.dummy = dummy
	return d, nil
}

// Password returns the identity of name when password is right.
func (d *Directory) Password(name, password string) (Identity, bool) {
	u, ok := d.users[name]
	if !ok {
		_ = bcrypt.CompareHashAndPassword(d.dummy, []byte(password))
		return Identity{}, false
	}
	if bcrypt.CompareHashAndPassword(u.hash, []byte(password)) != nil {
		return Identity{}, false
	}
	return Identity{Name: name, Role: u.role, Via: "session", Generation: u.gen}, true
}

// User returns the identity of the user name as the directory has it now:
// false for a user who is not (or no longer) in it.
func (d *Directory) User(name string) (Identity, bool) {
	u, ok := d.users[name]
	if !ok {
		return Identity{}, false
	}
	return Identity{Name: name, Role: u.role, Via: "session", Generation: u.gen}, true
}

// Token returns the identity of an API token.
func (d *Directory) Token(token string) (Identity, bool) {
	if token == "" {
		return Identity{}, false
	}
	id, ok := d.tokens[sha256.Sum256([]byte(token))]
	return id, ok
}

// HashPassword returns the bcrypt hash to store for password.
func HashPassword(password string) (string, error) {
	if len(password) < MinPasswordLen {
		return "", fmt.Errorf("password: at least %d characters", MinPasswordLen)
	}
	if len(password) > 72 {
		return "", errors.New("password: at most 72 bytes (bcrypt's limit)")
	}
	h, err := bcrypt.GenerateFromPassword([]byte(password), bcrypt.DefaultCost)
	if err != nil {
		return "", fmt.Errorf("hash password: %w", err)
	}
	return string(h), nil
}

// NewToken returns a fresh 256-bit API token and the SHA-256 hex to store.
func NewToken() (token, sum string, err error) {
	raw, err := RandomString(32)
	if err != nil {
		return "", "", err
	}
	token = "fgc_" + raw
	s := sha256.Sum256([]byte(token))
	return token, hex.EncodeToString(s[:]), nil
}

// RandomString returns n random bytes, URL-safe base64.
func RandomString(n int) (string, error) {
	b := make([]byte, n)
	if _, err := rand.Read(b); err != nil {
		return "", fmt.Errorf("read random: %w", err)
	}
	return base64.RawURLEncoding.EncodeToString(b), nil
}

// Equal compares two secrets in constant time.
func Equal(a, b string) bool {
	return len(a) == len(b) && subtle.ConstantTimeCompare([]byte(a), []byte(b)) == 1
}

// UserLine is the users-file entry for a user, as `console user add` prints it.
func UserLine(name string, role Role, hash string) string {
	return fmt.Sprintf("  - {name: %s, role: %s, password_hash: %q}", name, role, hash)
}

// TokenLine is the users-file entry for a token, a token-spec entry.
func TokenLine(name string, role Role, sum string) string {
	return fmt.Sprintf("  - %s:%s:%s", name, role, sum)
}

// BearerToken extracts the token of an "Authorization: Bearer" header.
func BearerToken(header string) string {
	const p = "Bearer "
	if len(header) > len(p) && strings.EqualFold(header[:len(p)], p) {
		return strings.TrimSpace(header[len(p):])
	}
	return ""
}
