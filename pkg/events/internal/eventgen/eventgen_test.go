package eventgen

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

// schema returns a minimal event schema whose properties follow "type".
func schema(props string, required ...string) string {
	req := `"type"`
	for _, r := range required {
		req += `, "` + r + `"`
	}
	return `{"title": "x.v1", "x-floodgate-go-type": "X", "type": "object", "required": [` + req + `],
		"properties": {"type": {"description": "t", "const": "x.v1"}` + props + `}}`
}

func generate(t *testing.T, schemas ...string) (map[string][]byte, error) {
	t.Helper()
	dir := t.TempDir()
	for i, s := range schemas {
		name := []string{"x.v1.json", "y.v1.json"}[i]
		if i == 1 {
			s = strings.ReplaceAll(strings.ReplaceAll(s, `"x.v1"`, `"y.v1"`), `"X"`, `"Y"`)
		}
		require.NoError(t, os.WriteFile(filepath.Join(dir, name), []byte(s), 0o644))
	}
	return Generate(dir)
}

func TestGenerateRefuses(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name, schema, want string
	}{
		{"string without a format", schema(`, "s": {"type": "string", "minLength": 1}`, "s"), "a string needs x-floodgate-format"},
		{"unknown format", schema(`, "s": {"type": "string", "x-floodgate-format": "uuid"}`, "s"), "a string needs x-floodgate-format"},
		{"optional string that may be empty", schema(`, "s": {"type": "string", "x-floodgate-format": "id"}`), `so that "" can mean absent`},
		{"optional integer that may be 0", schema(`, "n": {"type": "integer", "minimum": 0, "maximum": 5}`), "so that 0 can mean absent"},
		{"number bound other than 0, 1, 10", schema(`, "f": {"type": "number", "minimum": 0, "maximum": 2}`, "f"), "number bounds must be 0, 1 or 10"},
		{"object without a Go type", schema(`, "o": {"type": "object", "properties": {}}`, "o"), "needs x-floodgate-go-type"},
		{"enum without a Go name", schema(`, "e": {"type": "string", "enum": ["a"]}`, "e"), "needs x-floodgate-enum"},
		{"text without a max constant", schema(`, "s": {"type": "string", "maxLength": 3, "x-floodgate-format": "text"}`, "s"), "needs x-floodgate-max-const"},
		{"unknown keyword", schema(`, "b": {"type": "boolean", "x-floodgate-gotype": "bool"}`, "b"), "unknown keyword x-floodgate-gotype"},
		{"optional first member", `{"title": "x.v1", "x-floodgate-go-type": "X", "type": "object", "properties": {"type": {"const": "x.v1"}}}`, "must be required"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := generate(t, tt.schema)
			require.ErrorContains(t, err, tt.want)
		})
	}
	t.Run("one Go name, two values", func(t *testing.T) {
		a := schema(`, "s": {"type": "string", "maxLength": 3, "x-floodgate-format": "text", "x-floodgate-max-const": "MaxS"}`, "s")
		b := strings.Replace(a, `"maxLength": 3`, `"maxLength": 4`, 1)
		_, err := generate(t, a, b)
		require.ErrorContains(t, err, "MaxS is 4 here and 3 elsewhere")
	})
}

func TestGenerateShared(t *testing.T) {
	t.Parallel()
	// A member both schemas have goes to common_gen.go, the rest to each schema's file.
	s := schema(`, "p": {"description": "p", "x-floodgate-go-type": "P", "type": "object", "required": ["k"],
		"properties": {"k": {"description": "k", "type": "string", "enum": ["a_b", "ip"], "x-floodgate-enum": {"name": "K", "prefix": "K"}}}}`, "p")
	files, err := generate(t, s, s)
	require.NoError(t, err)
	require.Contains(t, string(files[CommonFile]), "type P struct")
	require.Contains(t, string(files[CommonFile]), `KAB K = "a_b"`)
	require.Contains(t, string(files[CommonFile]), `KIP K = "ip"`)
	require.Contains(t, string(files["x_v1_gen.go"]), "func DecodeX(")
	require.NotContains(t, string(files["x_v1_gen.go"]), "type P struct")
	require.Contains(t, string(files["y_v1_gen.go"]), "func DecodeY(")
	// The other exported functions of both events, one line each, in one file.
	require.Contains(t, string(files[APIFile]), "func EncodeX(")
	require.Contains(t, string(files[APIFile]), "return appendEvent(dst, v.Validate(), v, (*Y).appendJSON)")
	require.NotContains(t, string(files["x_v1_gen.go"]), "func EncodeX(")
}

func TestGenerateEnvelope(t *testing.T) {
	t.Parallel()
	id := `"id": {"description": "i", "type": "string", "maxLength": 64, "x-floodgate-format": "id"}`
	ts := `"ts": {"description": "t", "type": "string", "minLength": 24, "x-floodgate-format": "timestamp"}`
	at := `"at": {"description": "t", "type": "string", "x-floodgate-format": "timestamp"}`
	envelope := []string{"o.envelope(name, &v.ID, &v.TS)", "b = appendEnvelope(b, TypeX, v.ID, v.TS)", "c.envelope(v.ID, v.TS)"}
	tests := []struct {
		name, schema string
		envelope     bool
	}{
		{"type, id and ts", schema(`, `+id+`, `+ts, "id", "ts"), true},
		{"no ts", schema(`, `+id+`, `+at, "id", "at"), false},
		{"optional ts", schema(`, `+id+`, `+ts, "id"), false},
		{"ts first", schema(`, `+ts+`, `+id, "id", "ts"), false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			files, err := generate(t, tt.schema)
			require.NoError(t, err)
			src := string(files["x_v1_gen.go"])
			for _, call := range envelope {
				if tt.envelope {
					require.Contains(t, src, call)
				} else {
					require.NotContains(t, src, call)
				}
			}
			if !tt.envelope {
				// Each member then has a reader of its own.
				require.Contains(t, src, `v.ID = o.str(`)
			}
		})
	}
}

func TestGoName(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{
		"id": "ID", "ts": "TS", "distinct_ip24": "DistinctIP24", "top_ips": "TopIPs", "api_key": "APIKey",
		"penalty_multiplier": "PenaltyMultiplier", "cpu": "CPU", "incident_id": "IncidentID",
	} {
		require.Equal(t, want, goName(in), in)
	}
}
