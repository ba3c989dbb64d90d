package adjusterapi

import (
	"encoding/json"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestShedStep(t *testing.T) {
	tests := []struct {
		name    string
		step    ShedStep
		sheds   string
		changed bool
	}{
		{"nothing", ShedStep{}, "nothing shed", false},
		{"raised", ShedStep{Level: 2, Old: 1}, "bulk and best_effort shed", true},
		{"held", ShedStep{Level: 3, Old: 3}, "everything but critical shed", false},
		{"out of range", ShedStep{Level: 7, Old: 3}, "level 7", true},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Equal(t, tt.sheds, tt.step.Sheds())
			require.Equal(t, tt.changed, tt.step.Changed())
		})
	}
}

// The console decodes what the adjuster encodes: the documented field names.
func TestStatusJSON(t *testing.T) {
	in := Status{Version: 4, Scales: map[string]float64{"global": 0.5},
		Changes: []Change{{Scope: "global", Old: 1, New: 0.5, Rule: "cpu", Why: "cpu 0.91 > 0.85"}},
		Shed:    ShedStep{Level: 1, Why: "cpu"}, Pending: 2}
	b, err := json.Marshal(in)
	require.NoError(t, err)
	var raw map[string]any
	require.NoError(t, json.Unmarshal(b, &raw))
	for _, k := range []string{"at", "settings_version", "dry_run", "frozen", "scales", "signals", "stale", "engaged", "held", "changes", "overrides", "shed", "pending_events"} {
		require.Contains(t, raw, k)
	}
	require.NotContains(t, raw, "errors", "errors are omitted when there are none")
	var out Status
	require.NoError(t, json.Unmarshal(b, &out))
	require.Equal(t, in, out)
}
