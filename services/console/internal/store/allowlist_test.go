package store

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCheckAllow: the expiry and comment rules both allowlists (a
// principal's, a network's) apply.
func TestCheckAllow(t *testing.T) {
	now := time.Date(2026, 11, 28, 0, 0, 0, 0, time.UTC)
	for _, tc := range []struct {
		name    string
		expires time.Time
		comment string
		err     string // "" = accepted
	}{
		{"a day", now.Add(24 * time.Hour), "partner load test", ""},
		{"the longest", now.Add(MaxAllowlist), strings.Repeat("c", MaxReason), ""},
		{"now", now, "c", "the expiry must be in the future"},
		{"past", now.Add(-time.Minute), "c", "the expiry must be in the future"},
		{"too far", now.Add(MaxAllowlist + time.Second), "c", "the expiry is at most 365 days ahead"},
		{"no comment", now.Add(time.Hour), " \t", "a comment is required"},
		{"comment too long", now.Add(time.Hour), strings.Repeat("c", MaxReason+1), "the comment is longer than 1000 bytes"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			err := checkAllow(now, tc.expires, tc.comment)
			if tc.err == "" {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, ErrInvalid)
			require.ErrorContains(t, err, tc.err)
		})
	}
}
