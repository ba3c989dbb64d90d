package api

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestTokens(t *testing.T) {
	viewer, viewerLine, err := NewToken("vera", RoleViewer)
	require.NoError(t, err)
	sre, sreLine, err := NewToken("sam", RoleSRE)
	require.NoError(t, err)
	require.NotContains(t, viewerLine+sreLine, viewer, "the file holds hashes, never tokens")
	toks, legacy, err := ParseTokens("# comment\n\n" + viewerLine + "\n" + sreLine + "\n")
	require.NoError(t, err)
	require.False(t, legacy)
	inline, _, err := ParseTokens(viewerLine + "," + sreLine)
	require.NoError(t, err)
	require.Equal(t, toks, inline, "one a line or comma-separated")
	old, legacy, err := ParseTokens("# former file\nvera viewer " + HashToken(viewer) + "\nsam sre " + HashToken(sre) + "\n")
	require.NoError(t, err)
	require.True(t, legacy, "the former file form is read, and reported")
	require.Equal(t, toks, old)
	none, legacy, err := ParseTokens("# CHANGE-ME no tokens yet, so every API call is refused\n")
	require.NoError(t, err)
	require.False(t, legacy, "only comments: no entries, no form")
	require.Zero(t, none.Len())

	cases := []struct {
		name, token string
		ok          bool
		who         string
		mayChange   bool
	}{
		{"viewer", viewer, true, "vera", false},
		{"sre", sre, true, "sam", true},
		{"unknown", TokenPrefix + "x", false, "", false},
		{"hash is not a token", HashToken(sre), false, "", false},
		{"empty", "", false, "", false},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			p, ok := toks.Lookup(tc.token)
			require.Equal(t, tc.ok, ok)
			require.Equal(t, tc.who, p.Name)
			if ok {
				require.True(t, Allows(p.Role, RoleViewer))
				require.Equal(t, tc.mayChange, Allows(p.Role, RoleSRE))
			}
		})
	}
}

func TestParseTokensRejects(t *testing.T) {
	hash := strings.Repeat("ab", 32)
	cases := []struct{ name, file, want string }{
		{"spec: bad role", "vera:admin:" + hash, `role "admin"`},
		{"spec: bad hash", "vera:viewer:xyz", "entry 1 (vera): hash must be 64 hex digits"},
		{"spec: duplicate", "a:viewer:" + hash + "\nb:sre:" + hash, "entry 2 (b): the same token is listed twice"},
		{"spec: extra field", "a:viewer:" + hash + ":x", "entry 1: want name:role:sha256hex"},
		{"too few fields", "vera viewer\n", "line 1"},
		{"bad role", "vera admin " + hash + "\n", `role "admin"`},
		{"bad hash", "vera viewer xyz\n", "hex SHA-256"},
		{"bad name", "ve ra viewer " + hash + "\n", "line 1"},
		{"duplicate", "a viewer " + hash + "\nb sre " + hash + "\n", "line 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, _, err := ParseTokens(tc.file)
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, _, err := NewToken("sam", "root")
	require.Error(t, err)
}
