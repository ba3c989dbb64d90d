package auth

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestDeviceCookies(t *testing.T) {
	secret := []byte("device-cookie-test-secret-0123456789abcdef")
	now := time.Date(2026, 11, 27, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	d, err := NewDeviceCookies(secret, 90*24*time.Hour, clock)
	require.NoError(t, err)

	v, err := d.Issue("analyst1")
	require.NoError(t, err)
	id, ok := d.Verify("analyst1", v)
	require.True(t, ok)
	require.Len(t, id, 32)
	v2, err := d.Issue("analyst1")
	require.NoError(t, err)
	id2, ok := d.Verify("analyst1", v2)
	require.True(t, ok)
	require.NotEqual(t, id, id2, "every sign-in issues another device")
	require.True(t, strings.HasPrefix(d.Name("analyst1"), DeviceCookiePrefix))
	require.NotEqual(t, d.Name("analyst1"), d.Name("viewer1"), "one cookie per user")
	require.NotContains(t, d.Name("analyst1")+v, "analyst1")

	for name, tc := range map[string]struct{ account, value string }{
		"another user's": {"viewer1", v},
		"tampered nonce": {"analyst1", map[bool]string{true: "y", false: "x"}[v[0] == 'x'] + v[1:]}, // never v itself
		"tampered time":  {"analyst1", strings.Replace(v, ".", ".1", 1)},
		"no signature":   {"analyst1", v[:strings.LastIndex(v, ".")+1]},
		"garbage":        {"analyst1", "not a cookie"},
		"empty":          {"analyst1", ""},
		"no account":     {"", v},
		"very long":      {"analyst1", strings.Repeat("a", 300)},
		"bad base64":     {"analyst1", v[:strings.LastIndex(v, ".")+1] + "!!!"},
	} {
		t.Run(name, func(t *testing.T) {
			_, ok := d.Verify(tc.account, tc.value)
			require.False(t, ok)
		})
	}
	t.Run("another secret's", func(t *testing.T) {
		other, err := NewDeviceCookies([]byte("another-secret-0123456789abcdef-xyz"), 90*24*time.Hour, clock)
		require.NoError(t, err)
		_, ok := other.Verify("analyst1", v)
		require.False(t, ok)
	})
	t.Run("expired", func(t *testing.T) {
		now = now.Add(91 * 24 * time.Hour)
		_, ok := d.Verify("analyst1", v)
		require.False(t, ok)
	})
	t.Run("config", func(t *testing.T) {
		_, err := NewDeviceCookies([]byte("short"), time.Hour, nil)
		require.ErrorContains(t, err, "at least 32")
		_, err = NewDeviceCookies(secret, time.Minute, nil)
		require.ErrorContains(t, err, "at least 1h")
	})
}
