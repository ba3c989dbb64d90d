package events

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/santhosh-tekuri/jsonschema/v6"
	"github.com/stretchr/testify/require"
)

// schemasDir is the repository's schemas/ directory.
const schemasDir = "../../schemas"

// eventTypes are the contracts, in the order tests report them.
var eventTypes = []string{TypeDecision, TypeAbuse, TypeAdjustment, TypeRulesVersion, TypeDeferred, TypeVerdict}

// codec decodes and encodes one event type through this package, hiding the
// concrete Go type so that tests can range over all contracts.
type codec struct {
	decode   func([]byte) (any, error)
	encode   func(any) ([]byte, error)
	validate func(any) error
}

// codecOf is the codec of one event type T.
func codecOf[T any](decode func([]byte) (T, error), encode func(*T) ([]byte, error), validate func(*T) error) codec {
	return codec{
		decode:   func(b []byte) (any, error) { return decode(b) },
		encode:   func(v any) ([]byte, error) { ev := v.(T); return encode(&ev) },
		validate: func(v any) error { ev := v.(T); return validate(&ev) },
	}
}

// codecs are the codecs by event type.
var codecs = map[string]codec{
	TypeDecision:     codecOf(DecodeDecision, EncodeDecision, (*Decision).Validate),
	TypeAbuse:        codecOf(DecodeAbuse, EncodeAbuse, (*Abuse).Validate),
	TypeAdjustment:   codecOf(DecodeAdjustment, EncodeAdjustment, (*Adjustment).Validate),
	TypeRulesVersion: codecOf(DecodeRulesVersion, EncodeRulesVersion, (*RulesVersion).Validate),
	TypeDeferred:     codecOf(DecodeDeferred, EncodeDeferred, (*Deferred).Validate),
	TypeVerdict:      codecOf(DecodeVerdict, EncodeVerdict, (*Verdict).Validate),
}

func codecFor(t testing.TB, typ string) codec {
	t.Helper()
	c, ok := codecs[typ]
	if !ok {
		t.Fatalf("no codec for %q", typ)
	}
	return c
}

// typeOfFile returns the event type an example file is for: its name starts
// with the type ("decision.v1.denied.json").
func typeOfFile(t testing.TB, path string) string {
	t.Helper()
	base := filepath.Base(path)
	for _, typ := range eventTypes {
		if strings.HasPrefix(base, typ+".") {
			return typ
		}
	}
	t.Fatalf("%s: file name does not start with an event type", path)
	return ""
}

// example is one file of schemas/examples.
// eachValidExample decodes every example of schemas/examples, in a subtest
// each, and calls check with its codec and the decoded event.
func eachValidExample(t *testing.T, check func(t *testing.T, c codec, v any)) {
	for _, ex := range loadExamples(t, "examples") {
		t.Run(ex.name, func(t *testing.T) {
			c := codecFor(t, ex.typ)
			v, err := c.decode(ex.data)
			require.NoError(t, err)
			check(t, c, v)
		})
	}
}

type example struct {
	name string // file name without .json
	typ  string
	data []byte
}

func loadExamples(t testing.TB, dir string) []example {
	t.Helper()
	paths, err := filepath.Glob(filepath.Join(schemasDir, dir, "*.json"))
	require.NoError(t, err)
	require.NotEmpty(t, paths, "no examples in %s", dir)
	var out []example
	for _, p := range paths {
		data, err := os.ReadFile(p)
		require.NoError(t, err)
		out = append(out, example{
			name: strings.TrimSuffix(filepath.Base(p), ".json"),
			typ:  typeOfFile(t, p),
			data: data,
		})
	}
	return out
}

// schemaSet is the three contracts compiled by santhosh-tekuri/jsonschema.
type schemaSet struct {
	raw      map[string]map[string]any // the schema documents, by event type
	compiled map[string]*jsonschema.Schema
}

// loadSchemas compiles schemas/*.v1.json. With assertFormat the compiler also
// asserts "format" (date-time), as a strict validator in another language may;
// the patterns alone must already be exact, so both modes must agree with Go.
func loadSchemas(t testing.TB, assertFormat bool) schemaSet {
	t.Helper()
	set := schemaSet{raw: map[string]map[string]any{}, compiled: map[string]*jsonschema.Schema{}}
	c := jsonschema.NewCompiler()
	c.DefaultDraft(jsonschema.Draft2020)
	if assertFormat {
		c.AssertFormat()
	}
	ids := map[string]string{}
	for _, typ := range eventTypes {
		f, err := os.Open(filepath.Join(schemasDir, typ+".json"))
		require.NoError(t, err)
		doc, err := jsonschema.UnmarshalJSON(f)
		f.Close()
		require.NoError(t, err, typ)
		m := doc.(map[string]any)
		id, _ := m["$id"].(string)
		require.Equal(t, "https://floodgate.dev/schemas/"+typ+".json", id)
		require.NoError(t, c.AddResource(id, doc))
		set.raw[typ] = m
		ids[typ] = id
	}
	for _, typ := range eventTypes {
		sch, err := c.Compile(ids[typ])
		require.NoError(t, err, typ)
		set.compiled[typ] = sch
	}
	return set
}

// validate runs the JSON Schema of typ on data; malformed JSON is invalid.
func (s schemaSet) validate(typ string, data []byte) error {
	inst, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	if err != nil {
		return err
	}
	return s.compiled[typ].Validate(inst)
}

// mustJSON marshals v without HTML escaping.
func mustJSON(t testing.TB, v any) []byte {
	t.Helper()
	var buf bytes.Buffer
	enc := json.NewEncoder(&buf)
	enc.SetEscapeHTML(false)
	require.NoError(t, enc.Encode(v))
	return bytes.TrimSuffix(buf.Bytes(), []byte("\n"))
}

// parseInstance parses JSON keeping numbers exact.
func parseInstance(t testing.TB, data []byte) any {
	t.Helper()
	v, err := jsonschema.UnmarshalJSON(bytes.NewReader(data))
	require.NoError(t, err)
	return v
}
