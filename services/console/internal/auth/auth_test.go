package auth

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// TestUsersFileTokens: the users file lists tokens as token-spec entries
// (pkg/httpapi, name:role:sha256hex), as every service lists its callers;
// the former mapping is read for one release and reported.
func TestUsersFileTokens(t *testing.T) {
	tok, sum, err := NewToken()
	require.NoError(t, err)
	other, otherSum, err := NewToken()
	require.NoError(t, err)

	d, err := Parse([]byte("users: []\ntokens:\n" + TokenLine("ci-bot", RoleAnalyst, sum) + "\n  - ops:sre:" + strings.ToUpper(otherSum) + "\n"))
	require.NoError(t, err)
	require.False(t, d.LegacyTokens())
	id, ok := d.Token(tok)
	require.True(t, ok)
	require.Equal(t, Identity{Name: "ci-bot", Role: RoleAnalyst, Via: "token"}, id)
	id, ok = d.Token(other)
	require.True(t, ok)
	require.Equal(t, RoleSRE, id.Role)
	_, ok = d.Token(sum)
	require.False(t, ok, "the hash is not a token")

	old, err := Parse([]byte("users: []\ntokens:\n  - {name: ci-bot, role: analyst, sha256: " + sum + "}\n"))
	require.NoError(t, err)
	require.True(t, old.LegacyTokens())
	id, ok = old.Token(tok)
	require.True(t, ok)
	require.Equal(t, RoleAnalyst, id.Role)

	for _, tc := range []struct{ name, tokens, want string }{
		{"unknown role", "  - a:root:" + sum, `role "root" is not one of viewer|analyst|sre|admin`},
		{"short hash", "  - a:viewer:abc", "tokens: entry 1 (a): hash must be 64 hex digits"},
		{"missing role", "  - a:" + sum, "tokens: entry 1: want name:role:sha256hex"},
		{"same token twice", "  - a:viewer:" + sum + "\n  - b:sre:" + sum, "the same token is listed twice"},
		{"a list", "  - [a, b]", "a token is \"name:role:sha256hex\""},
	} {
		t.Run(tc.name, func(t *testing.T) {
			_, err := Parse([]byte("users: []\ntokens:\n" + tc.tokens + "\n"))
			require.ErrorContains(t, err, tc.want)
		})
	}
}
