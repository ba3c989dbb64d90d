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
	toks, err := ParseTokens(strings.NewReader("# comment\n\n" + viewerLine + "\n" + sreLine + "\n"))
	require.NoError(t, err)

	cases := []struct {
		name, token string
		ok          bool
		who         string
		mayChange   bool
	}{
		{"viewer", viewer, true, "vera", false},
		{"sre", sre, true, "sam", true},
		{"unknown", TokenPrefix + "x", false, "", false},
		{"hash is not a token", strings.Fields(sreLine)[2], false, "", false},
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
		{"too few fields", "vera viewer\n", "line 1"},
		{"bad role", "vera admin " + hash + "\n", `role "admin"`},
		{"bad hash", "vera viewer xyz\n", "hex SHA-256"},
		{"bad name", "ve ra viewer " + hash + "\n", "line 1"},
		{"duplicate", "a viewer " + hash + "\nb sre " + hash + "\n", "line 2"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			_, err := ParseTokens(strings.NewReader(tc.file))
			require.ErrorContains(t, err, tc.want)
		})
	}
	_, _, err := NewToken("sam", "root")
	require.Error(t, err)
}
