package events

import (
	"encoding/json"
	"fmt"
	"net/netip"
	"reflect"
	"regexp"
	"slices"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// The conformance suite proves that the JSON Schemas in schemas/ and this
// package's codec agree: on every example, and on a corpus of events mutated
// from the valid examples, both accept or both reject, and both match the
// expected outcome. Mutations are generated from the schemas themselves (drop
// each required member, wrong JSON types, null, enum values, length and
// numeric boundaries, array sizes, unknown members) plus hand-written value
// lists for the formats (ip, route, timestamp, principal id, resource).

func TestConformanceExamples(t *testing.T) {
	t.Parallel()
	for _, formats := range []bool{false, true} {
		schemas := loadSchemas(t, formats)
		for _, dir := range []string{"examples", "examples/invalid"} {
			wantValid := dir == "examples"
			for _, ex := range loadExamples(t, dir) {
				t.Run(fmt.Sprintf("formats=%v/%s", formats, ex.name), func(t *testing.T) {
					_, goErr := codecFor(t, ex.typ).decode(ex.data)
					schemaErr := schemas.validate(ex.typ, ex.data)
					require.Equal(t, wantValid, goErr == nil, "Go: %v", goErr)
					require.Equal(t, wantValid, schemaErr == nil, "schema: %v", schemaErr)
				})
			}
		}
	}
}

// mutation is one event of the corpus.
type mutation struct {
	name string
	doc  []byte
	// valid is the expected outcome for both validators.
	valid bool
	// goStricter marks a documented divergence: Go rejects what the schema
	// cannot reject (see package doc and schemas/README.md).
	goStricter bool
}

func TestConformanceMutations(t *testing.T) {
	t.Parallel()
	withFormats := loadSchemas(t, true)
	patternsOnly := loadSchemas(t, false)
	total := 0
	for _, ex := range loadExamples(t, "examples") {
		c := codecFor(t, ex.typ)
		muts := generateMutations(t, withFormats.raw[ex.typ], parseInstance(t, ex.data))
		total += len(muts)
		t.Run(ex.name, func(t *testing.T) {
			for _, m := range muts {
				t.Run(m.name, func(t *testing.T) {
					v, goErr := c.decode(m.doc)
					if goErr != nil {
						require.ErrorIs(t, goErr, ErrInvalid)
					}
					for _, s := range []schemaSet{withFormats, patternsOnly} {
						schemaErr := s.validate(ex.typ, m.doc)
						if m.goStricter {
							require.Error(t, goErr, "doc: %s", m.doc)
							require.NoError(t, schemaErr, "doc: %s", m.doc)
							continue
						}
						require.Equal(t, m.valid, schemaErr == nil, "schema: %v\ndoc: %s", schemaErr, m.doc)
					}
					require.Equal(t, m.valid && !m.goStricter, goErr == nil, "Go: %v\ndoc: %s", goErr, m.doc)
					if goErr != nil {
						return
					}
					// Whatever is accepted round-trips and validates.
					require.NoError(t, c.validate(v))
					enc, err := c.encode(v)
					require.NoError(t, err)
					v2, err := c.decode(enc)
					require.NoError(t, err)
					require.Equal(t, v, v2)
					require.NoError(t, withFormats.validate(ex.typ, enc), "re-encoded: %s", enc)
				})
			}
		})
	}
	t.Logf("%d mutated events", total)
	require.Greater(t, total, 500)
}

// generator walks a schema and an instance side by side.
type generator struct {
	t    testing.TB
	defs map[string]any
	root any
	out  []mutation
}

func generateMutations(t testing.TB, schema map[string]any, inst any) []mutation {
	g := &generator{t: t, defs: schema["$defs"].(map[string]any), root: inst}
	g.walk(schema, inst, nil, "")
	return g.out
}

type path []any // string member names and int indexes

func (p path) String() string {
	var b strings.Builder
	for _, e := range p {
		switch e := e.(type) {
		case string:
			if b.Len() > 0 {
				b.WriteByte('.')
			}
			b.WriteString(e)
		case int:
			fmt.Fprintf(&b, "[%d]", e)
		}
	}
	if b.Len() == 0 {
		return "(root)"
	}
	return b.String()
}

func (p path) plus(e any) path { return append(append(path{}, p...), e) }

// emit records the instance with the value at p replaced by v (or deleted
// when del).
func (g *generator) emit(name string, p path, v any, del bool, valid bool) {
	g.t.Helper()
	doc := deepCopy(g.t, g.root)
	if len(p) == 0 {
		doc = v
	} else {
		parent := doc
		for _, e := range p[:len(p)-1] {
			parent = child(parent, e)
		}
		switch last := p[len(p)-1].(type) {
		case string:
			m := parent.(map[string]any)
			if del {
				delete(m, last)
			} else {
				m[last] = v
			}
		case int:
			parent.([]any)[last] = v
		}
	}
	g.out = append(g.out, mutation{name: p.String() + " " + name, doc: mustJSON(g.t, doc), valid: valid})
}

func (g *generator) emitStricter(name string, p path, v any) {
	g.emit(name, p, v, false, true)
	g.out[len(g.out)-1].goStricter = true
}

func child(v any, e any) any {
	switch e := e.(type) {
	case string:
		return v.(map[string]any)[e]
	case int:
		return v.([]any)[e]
	}
	panic("bad path element")
}

func deepCopy(t testing.TB, v any) any { return parseInstance(t, mustJSON(t, v)) }

// walk generates mutations for the value inst at p, described by schema node;
// tag names the kind of value for the hand-written lists ("ip", "route", …).
func (g *generator) walk(node map[string]any, inst any, p path, tag string) {
	if ref, ok := node["$ref"].(string); ok {
		name := strings.TrimPrefix(ref, "#/$defs/")
		g.walk(g.defs[name].(map[string]any), inst, p, name)
		return
	}
	typ, _ := node["type"].(string)
	if len(p) > 0 {
		g.emit("null", p, nil, false, false)
		g.emit("wrong JSON type", p, wrongType(typ), false, false)
	}
	if c, ok := node["const"]; ok {
		g.emit("other const", p, c.(string)+"x", false, false)
		g.emit("upper-case const", p, strings.ToUpper(c.(string)), false, false)
		return
	}
	switch typ {
	case "object":
		obj := inst.(map[string]any)
		props := node["properties"].(map[string]any)
		req, _ := node["required"].([]any)
		for _, r := range req {
			name := r.(string)
			if _, ok := obj[name]; ok {
				g.emit("dropped", p.plus(name), nil, true, false)
			}
		}
		for name := range props {
			if _, ok := obj[name]; ok && !contains(req, name) {
				g.emit("optional dropped", p.plus(name), nil, true, true)
			}
		}
		g.emit("unknown member", p.plus("zz_unknown"), map[string]any{"nested": []any{json.Number("1e999"), nil, "x"}}, false, true)
		g.emit("upper-cased member names ignored", p, upperKeys(obj), false, len(req) == 0)
		for name, ps := range props {
			if v, ok := obj[name]; ok {
				sub := name
				if tag != "" {
					sub = tag + "." + name
				}
				g.walk(ps.(map[string]any), v, p.plus(name), sub)
			}
		}
	case "array":
		arr := inst.([]any)
		items := node["items"].(map[string]any)
		for i, v := range arr {
			g.walk(items, v, p.plus(i), tag+"[]")
		}
		g.emit("empty", p, []any{}, false, true)
		if maxN, ok := node["maxItems"].(json.Number); ok && len(arr) > 0 {
			n, _ := maxN.Int64()
			g.emit("at maxItems", p, slices.Repeat(arr[:1], int(n)), false, true)
			g.emit("over maxItems", p, slices.Repeat(arr[:1], int(n)+1), false, false)
		}
	case "string":
		g.strings(node, inst.(string), p, tag)
	case "integer":
		g.integers(node, p)
	case "number":
		g.numbers(node, p, tag)
	case "boolean":
		g.emit("true", p, true, false, true)
		g.emit("false", p, false, false, true)
	default:
		g.t.Fatalf("%s: no mutations for schema type %q", p, typ)
	}
}

func contains(list []any, s string) bool {
	for _, v := range list {
		if v == s {
			return true
		}
	}
	return false
}

func upperKeys(obj map[string]any) map[string]any {
	out := map[string]any{}
	for k, v := range obj {
		out[strings.ToUpper(k)] = v
	}
	return out
}

func wrongType(typ string) any {
	switch typ {
	case "string", "":
		return json.Number("1")
	case "integer", "number":
		return "1"
	case "boolean":
		return "true"
	case "object":
		return []any{}
	case "array":
		return map[string]any{}
	}
	panic(typ)
}

func num(n json.Number) int64 {
	v, err := n.Int64()
	if err != nil {
		panic(err)
	}
	return v
}

func (g *generator) strings(node map[string]any, val string, p path, tag string) {
	if enum, ok := node["enum"].([]any); ok {
		for _, e := range enum {
			g.emit("enum "+e.(string), p, e, false, true)
		}
		g.emit("not in enum", p, "bogus", false, false)
		g.emit("upper-cased enum", p, strings.ToUpper(val), false, strings.ToUpper(val) == val)
		g.emit("enum with space", p, val+" ", false, false)
		return
	}
	if minN, ok := node["minLength"].(json.Number); ok && num(minN) > 0 {
		g.emit("empty string", p, "", false, false)
	}
	switch tag {
	case "ip", "evidence.top_ips[].ip":
		for _, c := range ipCases {
			g.emit(fmt.Sprintf("ip %q", c.in), p, c.in, false, c.ok)
		}
		return
	case "timestamp":
		for _, c := range timeCases {
			g.emit(fmt.Sprintf("ts %q", c.in), p, c.in, false, c.ok)
		}
		return
	case "route":
		for _, r := range []struct {
			s  string
			ok bool
		}{{"/", true}, {"/a/{b_c}/d.e~f-g", true}, {"/users/@me", true}, {"/{Id}", true}, {"/v1/{name}:cancel", true},
			{"/a%2Fb", true}, {"/{Sid}.json", true}, {"/a/", false}, {"//", false}, {"/a?x=1", false}, {"/{a}{b}", false},
			{"/a%2", false}, {"/a%zz", false}, {"/{1a}", false}, {"/a b", false}, {"/a{b", false}, {"a/b", false}, {"/é", false}} {
			g.emit(fmt.Sprintf("route %q", r.s), p, r.s, false, r.ok)
		}
	case "principal.id":
		for _, c := range []struct {
			s  string
			ok bool
		}{{"a", true}, {"a b", true}, {"ip:203.0.113.7", true}, {"用户_１", true}, {strings.Repeat("é", 64), true},
			{"a\x00", false}, {"a\n", false}, {"\ta", false}, {"a\u007f", false}, {"a\u0085", false}, {"a\u009f", false}} {
			g.emit(fmt.Sprintf("principal id %q", c.s), p, c.s, false, c.ok)
		}
		// 65 two-byte characters: 130 bytes. The schema counts characters
		// and cannot see bytes; the Go codec can.
		g.emitStricter("principal id of 65 characters, 130 bytes", p, strings.Repeat("é", 65))
	case "resource":
		for _, c := range []struct {
			s  string
			ok bool
		}{{"a:b", true}, {"guild_2:x:y", true}, {"file:/a?b", true}, {"channel", false}, {":1", false}, {"Channel:1", false},
			{"channel:", false}, {"channel: 1", false}, {"channel:é", false}, {"1a:x", false}, {"a-b:1", false}} {
			g.emit(fmt.Sprintf("resource %q", c.s), p, c.s, false, c.ok)
		}
	case "evidence.crossing_event.topic":
		for _, c := range []struct {
			s  string
			ok bool
		}{{"a", true}, {"floodgate.decisions.v1", true}, {"A_b-9.x", true}, {"a b", false}, {"a/b", false}, {"é", false}, {"a:b", false}} {
			g.emit(fmt.Sprintf("topic %q", c.s), p, c.s, false, c.ok)
		}
	case "body":
		for _, c := range []struct {
			s  string
			ok bool
		}{{"AA==", true}, {"AAA=", true}, {"AAAA", true}, {"+/9z", true}, {"A===", false}, {"AA=A", false}, {"AAA", false},
			{"AA-_", false}, {"AA AA", false}, {"AAÀ=", false}, {"====", false}} {
			g.emit(fmt.Sprintf("base64 %q", c.s), p, c.s, false, c.ok)
		}
	case "id":
		for _, c := range []struct {
			s  string
			ok bool
		}{{"a", true}, {"A-b_9", true}, {"a.b", false}, {"a b", false}, {"é", false}} {
			g.emit(fmt.Sprintf("id %q", c.s), p, c.s, false, c.ok)
		}
	}
	if pat, ok := node["pattern"].(string); ok && strings.Contains(pat, `\x00-\x1f`) {
		multiline := strings.Contains(pat, `\x0b`)
		g.emit("tab", p, val+"\t", false, multiline)
		g.emit("newline", p, val+"\n", false, multiline)
		g.emit("carriage return", p, val+"\r", false, false)
		g.emit("NUL", p, val+"\x00", false, false)
		g.emit("DEL", p, val+"\x7f", false, false)
		g.emit("C1 control", p, val+"\u0080", false, false)
		g.emit("non-ASCII", p, val+"ü€😀", false, true)
	}
	if maxN, ok := node["maxLength"].(json.Number); ok {
		n := int(num(maxN))
		pad := val
		if strings.HasSuffix(pad, "}") {
			pad += "/"
		}
		if len(pad) < n {
			g.emit("at maxLength", p, pad+strings.Repeat("a", n-len(pad)), false, true)
			g.emit("over maxLength", p, pad+strings.Repeat("a", n+1-len(pad)), false, false)
			if tag != "principal.id" && tag != "route" && tag != "resource" && tag != "id" && tag != "evidence.crossing_event.topic" && tag != "body" {
				// Characters, not bytes: n non-ASCII characters are fine.
				g.emit("maxLength in non-ASCII characters", p, strings.Repeat("ü", n), false, true)
				g.emit("over maxLength in non-ASCII characters", p, strings.Repeat("ü", n+1), false, false)
			}
		}
	}
}

func (g *generator) integers(node map[string]any, p path) {
	lo := num(node["minimum"].(json.Number))
	hi := num(node["maximum"].(json.Number))
	lit := func(s string) json.Number { return json.Number(s) }
	type numberCase struct {
		name string
		v    json.Number
		ok   bool
	}
	cases := []numberCase{
		{"minimum", lit(strconv.FormatInt(lo, 10)), true},
		{"below minimum", lit(strconv.FormatInt(lo-1, 10)), false},
		{"maximum", lit(strconv.FormatInt(hi, 10)), true},
		{"above maximum", lit(strconv.FormatInt(hi+1, 10)), false},
		{"minimum as N.0", lit(strconv.FormatInt(lo, 10) + ".0"), true},
		{"minimum in exponent form", lit(strconv.FormatInt(lo, 10) + "e0"), true},
		{"maximum as N.000", lit(strconv.FormatInt(hi, 10) + ".000"), true},
		{"fraction", lit(strconv.FormatInt(lo, 10) + ".5"), false},
		{"tiny fraction", lit(strconv.FormatInt(lo, 10) + ".00000000000000000001"), false},
		{"huge", lit("1e400"), false},
		{"huge negative", lit("-1e400"), false},
		{"many digits", lit("123456789012345678901234567890"), false},
	}
	if lo == 0 {
		cases = append(cases,
			numberCase{"negative zero", lit("-0"), true},
			numberCase{"zero in exponent form", lit("0e5"), true})
	}
	if hi >= 1000 {
		cases = append(cases,
			numberCase{"1e3", lit("1e3"), true},
			numberCase{"1000e-3", lit("1000e-3"), true},
			numberCase{"12.5e1", lit("12.5e1"), true},
			numberCase{"1.25e1", lit("1.25e1"), false})
	}
	for _, c := range cases {
		g.emit(c.name+" "+string(c.v), p, c.v, false, c.ok)
	}
}

func (g *generator) numbers(node map[string]any, p path, tag string) {
	type tc struct {
		lit string
		ok  bool
	}
	var cases []tc
	if m, ok := node["minimum"].(json.Number); ok {
		require.Equal(g.t, json.Number("0"), m, "the decoder's exact boundary handling assumes bounds 0, 1 and 10")
		cases = append(cases, tc{"0", true}, tc{"-0", true}, tc{"-0.0", true}, tc{"0.00000000000000000001", true},
			tc{"-0.00000000000000000001", false}, tc{"-1e-400", false}, tc{"-5e-324", false}, tc{"-1", false})
	}
	if m, ok := node["exclusiveMinimum"].(json.Number); ok {
		require.Equal(g.t, json.Number("0"), m)
		cases = append(cases, tc{"0", false}, tc{"-0", false}, tc{"0e10", false}, tc{"1e-400", true}, tc{"5e-324", true},
			tc{"0.00000000000000000001", true}, tc{"-1e-400", false})
	}
	if m, ok := node["maximum"].(json.Number); ok {
		hi := num(m)
		require.Contains(g.t, []int64{1, 10}, hi)
		h := strconv.FormatInt(hi, 10)
		cases = append(cases, tc{h, true}, tc{h + ".0", true}, tc{h + "e0", true}, tc{h + "0e-1", true},
			tc{h + ".0000000000000001", false}, tc{h + ".00000000000000000001", false},
			tc{strconv.FormatInt(hi-1, 10) + ".99999999999999999999", true}, tc{strconv.FormatInt(hi+1, 10), false})
	} else {
		// No upper bound in the schema: anything finite as a float64 goes.
		cases = append(cases, tc{"1.7976931348623157e308", true}, tc{"12345678901234567890.5", true})
		g.emitStricter("1e400 (beyond float64)", p, json.Number("1e400"))
	}
	cases = append(cases, tc{"0.5", true}, tc{"5E-1", true})
	for _, c := range cases {
		g.emit("number "+c.lit, p, json.Number(c.lit), false, c.ok)
	}
}

// TestConformanceIPPattern compares the schema's ip pattern with the codec
// (net/netip) on the hand-written cases and on generated addresses in every
// text form.
func TestConformanceIPPattern(t *testing.T) {
	t.Parallel()
	s := loadSchemas(t, false)
	re := regexp.MustCompile(s.raw[TypeDecision]["$defs"].(map[string]any)["ip"].(map[string]any)["pattern"].(string))
	check := func(t *testing.T, ip string) {
		t.Helper()
		goOK := ValidIP(ip) == nil
		_, netipErr := netip.ParseAddr(ip)
		netipOK := netipErr == nil && !strings.Contains(ip, "%")
		require.Equal(t, netipOK, goOK, "Go vs net/netip on %q", ip)
		require.Equal(t, goOK, re.MatchString(ip) && len(ip) <= 45, "Go vs pattern on %q", ip)
	}
	for _, c := range ipCases {
		t.Run(c.in, func(t *testing.T) { check(t, c.in) })
	}
	t.Run("generated", func(t *testing.T) {
		n := 0
		for _, ip := range generatedIPs() {
			check(t, ip)
			n++
		}
		t.Logf("%d generated addresses", n)
	})
}

// generatedIPs returns valid addresses in many text forms and near misses.
func generatedIPs() []string {
	var out []string
	groups := []string{"0", "1", "ffff", "FfFf", "0db8", "00a", "12345", "g"}
	v4s := []string{"1.2.3.4", "255.255.255.255", "0.0.0.0", "01.2.3.4", "1.2.3.256", "1.2.3"}
	// Every split of n groups into left :: right, with and without an IPv4 tail.
	for total := 0; total <= 9; total++ {
		for left := 0; left <= total; left++ {
			for gi := range groups {
				mk := func(k, off int) []string {
					var s []string
					for i := 0; i < k; i++ {
						s = append(s, groups[(gi+i+off)%len(groups)])
					}
					return s
				}
				l, r := mk(left, 0), mk(total-left, 3)
				out = append(out, strings.Join(append(l, r...), ":"))
				out = append(out, strings.Join(l, ":")+"::"+strings.Join(r, ":"))
				for _, v4 := range v4s {
					tail := strings.Join(append(append([]string{}, r...), v4), ":")
					out = append(out, strings.Join(l, ":")+"::"+tail)
					out = append(out, strings.Join(append(l, tail), ":"))
				}
			}
		}
	}
	for i := 0; i < 300; i++ {
		out = append(out, fmt.Sprintf("%d.%d.%d.%d", i, i%7*40, (i*13)%260, i%3))
	}
	for _, s := range []string{":", ":::", "::1:", ":1::", "1:::2", "::1.2.3.4:1", "1:2:3:4:5:6:7:8:", ":1:2:3:4:5:6:7:8"} {
		out = append(out, s)
	}
	return out
}

// TestConformanceTimestampPattern compares the schema's timestamp pattern with
// ParseTime on every day of 1968–2101 and of some far years, plus near misses.
func TestConformanceTimestampPattern(t *testing.T) {
	t.Parallel()
	s := loadSchemas(t, false)
	re := regexp.MustCompile(s.raw[TypeDecision]["$defs"].(map[string]any)["timestamp"].(map[string]any)["pattern"].(string))
	check := func(ts string) {
		_, err := ParseTime(ts)
		if (err == nil) != re.MatchString(ts) {
			t.Fatalf("ParseTime and the pattern disagree on %q: %v", ts, err)
		}
	}
	for _, c := range timeCases {
		check(c.in)
	}
	years := []int{}
	for y := 1968; y <= 2101; y++ {
		years = append(years, y)
	}
	years = append(years, 2200, 2400, 2800, 3000, 3200, 3600, 4000, 5000, 6000, 8000, 9200, 9600, 9996, 9999, 1900, 1000, 0)
	n := 0
	for _, y := range years {
		for m := 0; m <= 13; m++ {
			for d := 0; d <= 32; d++ {
				check(fmt.Sprintf("%04d-%02d-%02dT23:59:59.999Z", y, m, d))
				n++
			}
		}
	}
	for h := 0; h <= 25; h++ {
		for _, ms := range []string{"00:00.000", "59:59.999", "60:00.000", "00:60.000"} {
			check(fmt.Sprintf("2026-06-15T%02d:%sZ", h, ms))
		}
	}
	// The calendar agrees with Go's.
	for d := time.Date(1970, 1, 1, 0, 0, 0, 0, time.UTC); d.Year() < 2101; d = d.AddDate(0, 0, 1) {
		if !re.MatchString(d.Format(TimeLayout)) {
			t.Fatalf("pattern rejects %s", d.Format(TimeLayout))
		}
	}
	t.Logf("%d generated timestamps", n)
}

// TestSchemaDefsShared checks that the $defs the three schemas share are
// identical: each schema is self-contained, so they are copies.
func TestSchemaDefsShared(t *testing.T) {
	t.Parallel()
	s := loadSchemas(t, false)
	seen := map[string]any{}
	for _, typ := range eventTypes {
		for name, def := range s.raw[typ]["$defs"].(map[string]any) {
			if prev, ok := seen[name]; ok {
				require.True(t, reflect.DeepEqual(prev, def), "$defs/%s differs in %s", name, typ)
			}
			seen[name] = def
		}
	}
	require.Len(t, seen, 5)
}

// TestSchemaDescriptions checks that every property of every schema has a
// description, and that each schema's required list names only its
// properties.
func TestSchemaDescriptions(t *testing.T) {
	t.Parallel()
	s := loadSchemas(t, false)
	var walk func(t *testing.T, where string, node map[string]any)
	walk = func(t *testing.T, where string, node map[string]any) {
		if props, ok := node["properties"].(map[string]any); ok {
			for name, p := range props {
				pm := p.(map[string]any)
				d, _ := pm["description"].(string)
				require.NotEmpty(t, d, "%s.%s has no description", where, name)
				walk(t, where+"."+name, pm)
			}
			req, _ := node["required"].([]any)
			for _, r := range req {
				require.Contains(t, props, r, "%s requires unknown %s", where, r)
			}
		}
		if items, ok := node["items"].(map[string]any); ok {
			walk(t, where+"[]", items)
		}
	}
	for _, typ := range eventTypes {
		t.Run(typ, func(t *testing.T) {
			root := s.raw[typ]
			require.Equal(t, "https://json-schema.org/draft/2020-12/schema", root["$schema"])
			walk(t, typ, root)
			for name, def := range root["$defs"].(map[string]any) {
				walk(t, typ+"#"+name, def.(map[string]any))
			}
		})
	}
}
