package events

import (
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// AppendDecisionUnchecked writes what AppendDecision writes for every valid
// decision example, and writes an invalid event as it is (its caller
// vouches for it).
func TestAppendDecisionUnchecked(t *testing.T) {
	for _, ex := range loadExamples(t, "examples") {
		if ex.typ != TypeDecision {
			continue
		}
		t.Run(ex.name, func(t *testing.T) {
			ev, err := DecodeDecision(ex.data)
			require.NoError(t, err)
			want, err := AppendDecision([]byte("x"), &ev)
			require.NoError(t, err)
			require.Equal(t, string(want), string(AppendDecisionUnchecked([]byte("x"), &ev)))
			ev.Gateway = ""
			_, err = AppendDecision(nil, &ev)
			require.Error(t, err)
			require.Contains(t, string(AppendDecisionUnchecked(nil, &ev)), `"gateway":""`)
		})
	}
}

func TestValidGateway(t *testing.T) {
	for _, tc := range []struct {
		name, gateway string
		ok            bool
	}{
		{"plain", "edge-eu-1", true},
		{"64 characters of 2 bytes", strings.Repeat("é", 64), true},
		{"empty", "", false},
		{"65 characters", strings.Repeat("a", 65), false},
		{"a control character", "edge\x01", false},
		{"invalid UTF-8", "edge\xff", false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, tc.ok, ValidGateway(tc.gateway) == nil, "%v", ValidGateway(tc.gateway))
		})
	}
}
