package events

import (
	"bytes"
	"encoding/json"
	"errors"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestExamplesDecode(t *testing.T) {
	t.Parallel()
	eachValidExample(t, func(t *testing.T, _ codec, v any) {
		require.NotZero(t, v)
	})
}

func TestInvalidExamplesRejected(t *testing.T) {
	t.Parallel()
	for _, ex := range loadExamples(t, "examples/invalid") {
		t.Run(ex.name, func(t *testing.T) {
			v, err := codecFor(t, ex.typ).decode(ex.data)
			require.Error(t, err)
			require.ErrorIs(t, err, ErrInvalid)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, ex.typ, ve.Type)
			require.Zero(t, v, "a failed decode returns the zero event")
			t.Log(err)
		})
	}
}

func TestRoundTripLossless(t *testing.T) {
	t.Parallel()
	eachValidExample(t, func(t *testing.T, c codec, v1 any) {
		enc1, err := c.encode(v1)
		require.NoError(t, err)
		v2, err := c.decode(enc1)
		require.NoError(t, err)
		require.Equal(t, v1, v2)
		enc2, err := c.encode(v2)
		require.NoError(t, err)
		require.Equal(t, string(enc1), string(enc2), "encoding is deterministic")
		// The encoding is plain JSON for any reader.
		require.True(t, json.Valid(enc1))
	})
}

func TestDecisionRoundTripFromGo(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 11, 22, 10, 0, 0, 123_456_789, time.FixedZone("CET", 3600))
	d := Decision{
		ID: "evt-1", TS: ts, Principal: Principal{PrincipalUser, "ü\"ser\\\u2028x"},
		IP: netip.MustParseAddr("2001:DB8::1"), Method: "DELETE", Route: "/a/{b}", Resource: "x:<&>",
		Allowed: false, Tier: TierQuota, Shadow: true, Cost: 1_000_000, Limit: MaxSafeInteger,
		Remaining: 0, Gateway: "gw <1>", NearLimit: true, Degraded: true, Rule: "r", PenaltyMultiplier: 1e-7,
	}
	b, err := EncodeDecision(&d)
	require.NoError(t, err)
	require.Contains(t, string(b), `"ts":"2026-11-22T09:00:00.123Z"`, "UTC, truncated to the millisecond")
	require.Contains(t, string(b), `"id":"ü\"ser\\\u2028x"`)
	require.Contains(t, string(b), `"penalty_multiplier":1e-7`)
	got, err := DecodeDecision(b)
	require.NoError(t, err)
	want := d
	want.TS = time.Date(2026, 11, 22, 9, 0, 0, 123_000_000, time.UTC)
	require.Equal(t, want, got)

	// encoding/json uses the same codec (and then HTML-escapes <, > and &).
	viaStd, err := json.Marshal(d)
	require.NoError(t, err)
	require.Contains(t, string(viaStd), `"resource":"x:\u003c\u0026\u003e"`)
	var back Decision
	require.NoError(t, json.Unmarshal(viaStd, &back))
	require.Equal(t, want, back)
	require.ErrorIs(t, json.Unmarshal([]byte(`{"type":"decision.v1"}`), &back), ErrInvalid)
}

func TestAppendDoesNotAllocate(t *testing.T) {
	d, err := DecodeDecision(loadExample(t, "decision.v1.denied"))
	require.NoError(t, err)
	buf := make([]byte, 0, 1024)
	allocs := testing.AllocsPerRun(100, func() {
		if _, err := AppendDecision(buf[:0], &d); err != nil {
			t.Fatal(err)
		}
	})
	require.Zero(t, allocs)
}

func loadExample(t testing.TB, name string) []byte {
	t.Helper()
	for _, ex := range loadExamples(t, "examples") {
		if ex.name == name {
			return ex.data
		}
	}
	t.Fatalf("no example %s", name)
	return nil
}

// TestDecodeErrors pins the exact messages: they end up in DLQ headers and in
// front of the people reading them.
func TestDecodeErrors(t *testing.T) {
	t.Parallel()
	valid := string(loadExample(t, "decision.v1.minimal"))
	with := func(old, new string) string {
		require.Contains(t, valid, old)
		return strings.Replace(valid, old, new, 1)
	}
	// offset returns where marker starts in s, plus skip.
	offset := func(s, marker string, skip int) string {
		i := strings.Index(s, marker)
		require.GreaterOrEqual(t, i, 0, marker)
		return strconv.Itoa(i + skip)
	}
	dup := with(`"cost":1`, `"cost":1,"cost":2`)
	badUTF8 := with(`"gw"`, "\"g\xffw\"")
	surrogate := with(`"gw"`, `"\ud800"`)
	tests := []struct {
		name string
		in   string
		want ValidationError
	}{
		{"unknown kind", with(`"kind":"anonymous"`, `"kind":"robot"`),
			ValidationError{TypeDecision, "principal.kind", `"robot" is not one of user|bot|api_key|anonymous`}},
		{"missing member", with(`"gateway":"gw"`, `"gw":"gw"`),
			ValidationError{TypeDecision, "gateway", "is required"}},
		{"missing nested member", with(`"kind":"anonymous",`, ``),
			ValidationError{TypeDecision, "principal.kind", "is required"}},
		{"wrong JSON type", with(`"cost":1`, `"cost":"1"`),
			ValidationError{TypeDecision, "cost", "must be an integer, got a string"}},
		{"null", with(`"allowed":true`, `"allowed":null`),
			ValidationError{TypeDecision, "allowed", "must be a boolean, got null"}},
		{"not an integer", with(`"cost":1`, `"cost":1.5`),
			ValidationError{TypeDecision, "cost", `must be an integer, got "1.5"`}},
		{"out of range", with(`"cost":1`, `"cost":1000001`),
			ValidationError{TypeDecision, "cost", `must be between 1 and 1000000, got "1000001"`}},
		{"type", with(`"type":"decision.v1"`, `"type":"abuse.v1"`),
			ValidationError{TypeDecision, "type", `must be "decision.v1", got "abuse.v1"`}},
		{"ip", with(`"ip":"198.51.100.23"`, `"ip":"198.51.100.256"`),
			ValidationError{TypeDecision, "ip", `"198.51.100.256" is not an IPv4 or IPv6 address`}},
		{"route", with(`"route":"/"`, `"route":"/a//b"`),
			ValidationError{TypeDecision, "route", `"/a//b" has an empty segment at byte 3`}},
		{"ts", with(`"ts":"2026-11-22T10:00:00.000Z"`, `"ts":"2026-11-22T10:00:00Z"`),
			ValidationError{TypeDecision, "ts", `"2026-11-22T10:00:00Z" is not a UTC timestamp with millisecond precision like 2026-11-22T10:00:00.123Z`}},
		{"penalty multiplier", with(`"gateway":"gw"`, `"gateway":"gw","penalty_multiplier":0`),
			ValidationError{TypeDecision, "penalty_multiplier", "must be > 0 and <= 1, got 0"}},
		{"long value is cut", with(`"gateway":"gw"`, `"gateway":"`+strings.Repeat("g", 65)+`"`),
			ValidationError{TypeDecision, "gateway", `"` + strings.Repeat("g", 64) + `"… is 65 characters long, the limit is 64`}},
		{"duplicate member", dup,
			ValidationError{TypeDecision, "", `invalid JSON: duplicate member "cost" at offset ` + offset(dup, `"cost":2`, 7)}},
		{"malformed", `{"type":"decision.v1",}`,
			ValidationError{TypeDecision, "", `invalid JSON: invalid character '}' looking for beginning of object key string at offset 22`}},
		{"truncated", `{"type":"decision.v1"`,
			ValidationError{TypeDecision, "", `invalid JSON: unexpected end of input at offset 21`}},
		{"trailing data", valid + `{}`,
			ValidationError{TypeDecision, "", `invalid JSON: invalid character '{' after top-level value at offset ` + strconv.Itoa(len(valid))}},
		{"not an object", `[]`,
			ValidationError{TypeDecision, "", `must be an object, got an array`}},
		{"empty input", ``,
			ValidationError{TypeDecision, "", `invalid JSON: unexpected end of input at offset 0`}},
		{"invalid UTF-8", badUTF8,
			ValidationError{TypeDecision, "", `invalid JSON: invalid UTF-8 in string at offset ` + offset(badUTF8, "\xff", 0)}},
		{"lone surrogate", surrogate,
			ValidationError{TypeDecision, "", `invalid JSON: lone UTF-16 surrogate in string at offset ` + offset(surrogate, `\ud800`, 0)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			_, err := DecodeDecision([]byte(tt.in))
			require.ErrorIs(t, err, ErrInvalid)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tt.want, *ve)
			want := strings.Join(nonEmpty(tt.want.Type, tt.want.Field, tt.want.Reason), ": ")
			require.Equal(t, want, err.Error())
		})
	}
}

// TestEnvelope breaks the members every event starts with, which one
// members.envelope reads for all events with "type", "id" and "ts", in every
// example: each break is reported at its member, whatever the event.
func TestEnvelope(t *testing.T) {
	t.Parallel()
	for _, ex := range loadExamples(t, "examples") {
		t.Run(ex.name, func(t *testing.T) {
			var buf bytes.Buffer
			require.NoError(t, json.Compact(&buf, ex.data))
			valid := buf.String()
			idStart := `{"type":"` + ex.typ + `","id":"`
			require.True(t, strings.HasPrefix(valid, idStart), valid)
			idEnd := len(idStart) + strings.IndexByte(valid[len(idStart):], '"') + 1
			rest := valid[idEnd:] // after the id's closing quote
			tests := []struct{ name, in, field, reason string }{
				{"duplicate type", `{"type":"` + ex.typ + `",` + valid[1:], "", `duplicate member "type"`},
				{"other type", `{"type":"x.v1"` + valid[len(`{"type":"`+ex.typ+`"`):], "type", `must be "` + ex.typ + `", got "x.v1"`},
				{"duplicate id", valid[:idEnd] + `,"id":"x"` + rest, "", `duplicate member "id"`},
				{"bad id", idStart + `a b"` + rest, "id", `"a b"`},
			}
			if ts, ok := strings.CutPrefix(rest, `,"ts":"`); ok {
				afterTS := ts[strings.IndexByte(ts, '"')+1:]
				tests = append(tests,
					struct{ name, in, field, reason string }{"bad ts", valid[:idEnd] + `,"ts":"2026-11-22"` + afterTS, "ts", `"2026-11-22" is not a UTC timestamp`},
					struct{ name, in, field, reason string }{"no ts", valid[:idEnd] + afterTS, "ts", "is required"},
				)
			}
			for _, tt := range tests {
				_, err := codecFor(t, ex.typ).decode([]byte(tt.in))
				var ve *ValidationError
				require.ErrorAs(t, err, &ve, tt.name)
				require.Equal(t, ex.typ, ve.Type, tt.name)
				require.Equal(t, tt.field, ve.Field, tt.name)
				require.Contains(t, ve.Reason, tt.reason, tt.name)
			}
		})
	}
}

// TestEnumValues checks enum.values, the list in every enum error, against
// enumValue, which decodes and validates: each listed value is one, and
// nothing else is.
func TestEnumValues(t *testing.T) {
	t.Parallel()
	n := 0
	for e := enum(0); e.values() != ""; e++ {
		for _, v := range strings.Split(e.values(), "|") {
			got, ok := enumValue(e, v)
			require.True(t, ok, "enum %d: %q", e, v)
			require.Equal(t, v, got)
			_, ok = enumValue(e, v+"x")
			require.False(t, ok, "enum %d: %q", e, v+"x")
			n++
		}
		err := checkEnum(e, "nope")
		require.NotNil(t, err)
		require.Equal(t, `"nope" is not one of `+e.values(), err.Reason)
	}
	require.Greater(t, n, 20, "every enum of the schemas is listed")
	require.Equal(t, Methods, enumMethod.values())
	require.Nil(t, checkEnum(enumTier, TierQuota))
}

func nonEmpty(parts ...string) []string {
	var out []string
	for _, p := range parts {
		if p != "" {
			out = append(out, p)
		}
	}
	return out
}

func TestNestedErrorPaths(t *testing.T) {
	t.Parallel()
	ex := string(loadExample(t, "abuse.v1.distributed_ip"))
	tests := []struct {
		name, old, new, field string
	}{
		{"array element member", `"ip": "2001:db8:4:1::17"`, `"ip": "2001:db8::g"`, "evidence.top_ips[1].ip"},
		{"array element required", `{"route": "/auth/mfa", "count": 12}`, `{"route": "/auth/mfa"}`, "evidence.top_routes[1].count"},
		{"array element type", `{"route": "/auth/mfa", "count": 12}`, `"/auth/mfa"`, "evidence.top_routes[1]"},
		{"nested object", `"mode": "simulated"`, `"mode": "dry"`, "penalty.mode"},
		{"window", `"seconds": 60`, `"seconds": -60`, "window.seconds"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			require.Contains(t, ex, tt.old)
			_, err := DecodeAbuse([]byte(strings.Replace(ex, tt.old, tt.new, 1)))
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, tt.field, ve.Field, err.Error())
		})
	}
	t.Run("too many items", func(t *testing.T) {
		item := `{"route": "/auth/mfa", "count": 12}`
		many := strings.TrimSuffix(strings.Repeat(item+",", 11), ",")
		_, err := DecodeAbuse([]byte(strings.Replace(ex, item, many, 1)))
		require.EqualError(t, err, "abuse.v1: evidence.top_routes: has more than 10 items")
	})
}

func TestValidateOnEncode(t *testing.T) {
	t.Parallel()
	good, err := DecodeDecision(loadExample(t, "decision.v1.denied"))
	require.NoError(t, err)
	tests := []struct {
		name   string
		mutate func(*Decision)
		want   string
	}{
		{"zero time", func(d *Decision) { d.TS = time.Time{} }, "decision.v1: ts: is required"},
		{"before 1970", func(d *Decision) { d.TS = time.Unix(-1, 0) }, "decision.v1: ts: must be between 1970 and 9999, got 1969-12-31T23:59:59Z"},
		{"after 9999", func(d *Decision) { d.TS = time.Date(10000, 1, 1, 0, 0, 0, 0, time.UTC) }, "decision.v1: ts: must be between 1970 and 9999, got 10000-01-01T00:00:00Z"},
		{"no IP", func(d *Decision) { d.IP = netip.Addr{} }, "decision.v1: ip: is required"},
		{"IP zone", func(d *Decision) { d.IP = netip.MustParseAddr("fe80::1%eth0") }, `decision.v1: ip: "fe80::1%eth0" has a zone; zones are not allowed`},
		{"no kind", func(d *Decision) { d.Principal.Kind = "" }, "decision.v1: principal.kind: must be one of user|bot|api_key|anonymous"},
		{"id too long", func(d *Decision) { d.Principal.ID = strings.Repeat("é", 65) }, `decision.v1: principal.id: "` + strings.Repeat("é", 32) + `"… is 130 bytes long, the limit is 128 bytes`},
		{"invalid UTF-8", func(d *Decision) { d.Gateway = "g\xff" }, `decision.v1: gateway: "g\xff" is not valid UTF-8 at byte 1`},
		{"control character", func(d *Decision) { d.Rule = "a\u0085" }, `decision.v1: rule: "a\u0085" has control character U+0085 at byte 1`},
		{"method", func(d *Decision) { d.Method = "get" }, `decision.v1: method: "get" is not one of GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS`},
		{"tier", func(d *Decision) { d.Tier = "" }, `decision.v1: tier: must be one of ip|principal|endpoint|resource|quota|penalty`},
		{"NaN multiplier", func(d *Decision) { d.PenaltyMultiplier = math.NaN() }, "decision.v1: penalty_multiplier: must be > 0 and <= 1, got NaN"},
		{"negative multiplier", func(d *Decision) { d.PenaltyMultiplier = -0.5 }, "decision.v1: penalty_multiplier: must be > 0 and <= 1, got -0.5"},
		{"remaining over 2^53", func(d *Decision) { d.Remaining = MaxSafeInteger + 1 }, "decision.v1: remaining: must be between 0 and 9007199254740991, got 9007199254740992"},
		{"resource", func(d *Decision) { d.Resource = "channel" }, `decision.v1: resource: "channel" is not of the form type:id, e.g. "channel:123"`},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			d := good
			tt.mutate(&d)
			require.EqualError(t, d.Validate(), tt.want)
			dst := []byte("keep")
			out, err := AppendDecision(dst, &d)
			require.ErrorIs(t, err, ErrInvalid)
			require.Equal(t, "keep", string(out))
			_, err = EncodeDecision(&d)
			require.EqualError(t, err, tt.want)
		})
	}
	t.Run("abuse", func(t *testing.T) {
		a, err := DecodeAbuse(loadExample(t, "abuse.v1.rapid_fire"))
		require.NoError(t, err)
		a.Evidence.TopIPs[0].IP = netip.Addr{}
		_, err = EncodeAbuse(&a)
		require.EqualError(t, err, "abuse.v1: evidence.top_ips[0].ip: is required")
		a.Evidence.TopRoutes = make([]RouteCount, 11)
		require.EqualError(t, a.Validate(), "abuse.v1: evidence.top_routes: has 11 items, the limit is 10")
	})
	t.Run("abuse crossing event", func(t *testing.T) {
		a, err := DecodeAbuse(loadExample(t, "abuse.v1.rapid_fire"))
		require.NoError(t, err)
		require.Equal(t, &EventRef{Topic: "floodgate.decisions.v1", Partition: 3, Offset: 1048576}, a.Evidence.CrossingEvent)
		a.Evidence.CrossingEvent = &EventRef{Topic: "decisions v1"}
		_, err = EncodeAbuse(&a)
		require.EqualError(t, err, `abuse.v1: evidence.crossing_event.topic: "decisions v1" has ' ' at byte 9; allowed are A-Z a-z 0-9 . _ -`)
		a.Evidence.CrossingEvent = &EventRef{Topic: "t", Partition: -1}
		require.EqualError(t, a.Validate(), "abuse.v1: evidence.crossing_event.partition: must be between 0 and 2147483647, got -1")
		a.Evidence.CrossingEvent = nil
		enc, err := EncodeAbuse(&a)
		require.NoError(t, err)
		require.NotContains(t, string(enc), "crossing_event", "absent stays absent")
	})
	t.Run("adjustment", func(t *testing.T) {
		a, err := DecodeAdjustment(loadExample(t, "adjustment.v1"))
		require.NoError(t, err)
		a.NewScale = 0
		_, err = EncodeAdjustment(&a)
		require.EqualError(t, err, "adjustment.v1: new_scale: must be > 0 and <= 10, got 0")
		a.NewScale, a.Reason = 1, "line one\nline two\ttabbed"
		_, err = EncodeAdjustment(&a)
		require.NoError(t, err)
		a.Reason = "bell\a"
		require.EqualError(t, a.Validate(), `adjustment.v1: reason: "bell\a" has control character U+0007 at byte 4`)
	})
}

// TestDecodedEventsValidate checks that the decoder, which validates each
// member as it reads it, agrees with Validate on everything it accepts.
func TestDecodedEventsValidate(t *testing.T) {
	t.Parallel()
	eachValidExample(t, func(t *testing.T, c codec, v any) {
		require.NoError(t, c.validate(v))
	})
}

func TestValidRoute(t *testing.T) {
	t.Parallel()
	tests := []struct {
		route string
		ok    bool
	}{
		{"/", true},
		{"/a", true},
		{"/channels/{channel_id}/messages", true},
		{"/v2/search.json", true},
		{"/a.b~c_d-E9", true},
		{"/{_}", true},
		{"/{a1}/{b_2}", true},
		{"/" + strings.Repeat("a", 255), true},
		{"/" + strings.Repeat("a", 256), false},
		{"", false},
		{"a", false},
		{"//", false},
		{"/a/", false},
		{"/a//b", false},
		{"/a?b=1", false},
		{"/a#frag", false},
		{"/users/@me", true},
		{"/{A}", true},
		{"/{a-b}", true},
		{"/a{b}", true},
		{"/{a}b", true},
		{"/{Sid}.json", true},
		{"/v1/{name}:cancel", true},
		{"/a%20b", true},
		{"/a%2fb", true},
		{"/!$&'()*+,;=:@", true},
		{"/{1a}", false},
		{"/{-a}", false},
		{"/{}", false},
		{"/{a", false},
		{"/{a/b}", false},
		{"/a}", false},
		{"/{a}{b}", false},
		{"/x{a}{b}y", false},
		{"/é", false},
		{"/a b", false},
		{"/a%2", false},
		{"/a%g0", false},
		{"/a\"b", false},
		{"/a<b>", false},
		{"/a\\b", false},
		{"/a|b", false},
		{"/a^b", false},
		{"/a`b", false},
		{"/a/\x00", false},
	}
	for _, tt := range tests {
		t.Run(tt.route, func(t *testing.T) {
			err := ValidRoute(tt.route)
			if tt.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrInvalid)
			}
		})
	}
}

// grammarCase is a string and whether its grammar accepts it.
type grammarCase struct {
	in string
	ok bool
}

// ipCases are shared by the Go and the schema tests.
var ipCases = []grammarCase{
	{"0.0.0.0", true},
	{"203.0.113.7", true},
	{"255.255.255.255", true},
	{"::", true},
	{"::1", true},
	{"2001:DB8::1", true},
	{"2001:0db8:0000:0000:0000:0000:0000:0001", true},
	{"::ffff:192.0.2.1", true},
	{"::192.0.2.1", true},
	{"64:ff9b::192.0.2.33", true},
	{"1:2:3:4:5:6:7::", true},
	{"::2:3:4:5:6:7:8", true},
	{"1:2:3:4:5:6:1.2.3.4", true},
	{"1:2:3:4:5::1.2.3.4", true},
	{"0000:0000:0000:0000:0000:0000:255.255.255.255", true},
	{"", false},
	{"256.1.1.1", false},
	{"1.2.3", false},
	{"1.2.3.4.5", false},
	{"01.2.3.4", false},
	{"1.2.3.00", false},
	{"1.2.3.4 ", false},
	{" 1.2.3.4", false},
	{"+1.2.3.4", false},
	{"1.2.3.-4", false},
	{"1..3.4", false},
	{"1.2.3.4.", false},
	{"0x7f.0.0.1", false},
	{"fe80::1%eth0", false},
	{"1.2.3.4%eth0", false},
	{"1:2:3:4:5:6:7:8:9", false},
	{"1:2:3:4:5:6:7:8::", false},
	{"1::2::3", false},
	{"12345::", false},
	{":::", false},
	{"1:2:3:4:5:6:7", false},
	{"::ffff:1.2.3.04", false},
	{"1:2:3:4:5:6:7:1.2.3.4", false},
	{"1.2.3.4::", false},
	{"localhost", false},
	{"[::1]", false},
	{"::1/128", false},
	{"1.2.3.4/24", false},
	{"１.2.3.4", false},
}

// testGrammar checks, in a subtest a case, that parse accepts exactly the
// cases that are ok (and rejects the others with ErrInvalid), then calls check
// with what it returned.
func testGrammar[T any](t *testing.T, cases []grammarCase, parse func(string) (T, error), check func(*testing.T, grammarCase, T)) {
	for _, c := range cases {
		t.Run(c.in, func(t *testing.T) {
			got, err := parse(c.in)
			if c.ok {
				require.NoError(t, err)
			} else {
				require.ErrorIs(t, err, ErrInvalid)
			}
			check(t, c, got)
		})
	}
}

// timeCases are shared by the Go and the schema tests.
var timeCases = []grammarCase{
	{"2026-11-22T10:00:00.123Z", true},
	{"1970-01-01T00:00:00.000Z", true},
	{"9999-12-31T23:59:59.999Z", true},
	{"2028-02-29T12:00:00.000Z", true},
	{"2000-02-29T00:00:00.000Z", true},
	{"2026-04-30T00:00:00.000Z", true},
	{"1969-12-31T23:59:59.999Z", false},
	{"0001-01-01T00:00:00.000Z", false},
	{"2100-02-29T00:00:00.000Z", false},
	{"2027-02-29T00:00:00.000Z", false},
	{"2026-04-31T00:00:00.000Z", false},
	{"2026-13-01T00:00:00.000Z", false},
	{"2026-00-01T00:00:00.000Z", false},
	{"2026-01-00T00:00:00.000Z", false},
	{"2026-11-22T24:00:00.000Z", false},
	{"2026-11-22T23:60:00.000Z", false},
	{"2026-12-31T23:59:60.000Z", false},
	{"2026-11-22t10:00:00.000Z", false},
	{"2026-11-22T10:00:00.000z", false},
	{"2026-11-22T10:00:00.000+00:00", false},
	{"2026-11-22T10:00:00.12Z", false},
	{"2026-11-22T10:00:00.1234Z", false},
	{"2026-11-22 10:00:00.000Z", false},
	{"2026-11-22T10:00:00Z", false},
	{"2026-11-22T10:00:00.000", false},
	{"+2026-11-22T10:00:00.000Z", false},
	{"2026-11-22T10:00:00.-12Z", false},
	{"２０２６-11-22T10:00:00.000Z", false},
	{"", false},
}

// TestGrammars checks the parsers of the address and timestamp grammars on
// the cases the schema tests share.
func TestGrammars(t *testing.T) {
	t.Parallel()
	t.Run("ip", func(t *testing.T) {
		testGrammar(t, ipCases, ParseIP, func(t *testing.T, c grammarCase, a netip.Addr) {
			if !c.ok {
				require.ErrorIs(t, ValidIP(c.in), ErrInvalid)
				return
			}
			require.NoError(t, ValidIP(c.in))
			require.Equal(t, netip.MustParseAddr(c.in), a)
		})
	})
	t.Run("timestamp", func(t *testing.T) {
		testGrammar(t, timeCases, ParseTime, func(t *testing.T, c grammarCase, got time.Time) {
			if !c.ok {
				return
			}
			want, err := time.Parse(TimeLayout, c.in)
			require.NoError(t, err)
			require.Equal(t, want, got)
			require.Equal(t, c.in, FormatTime(got))
		})
	})
}

func TestFormatTime(t *testing.T) {
	t.Parallel()
	ts := time.Date(2026, 1, 2, 3, 4, 5, 999_999_999, time.FixedZone("x", -7*3600))
	require.Equal(t, "2026-01-02T10:04:05.999Z", FormatTime(ts))
	require.Equal(t, ts.UTC().Truncate(time.Millisecond).Format(TimeLayout), FormatTime(ts))
}

func TestPrincipalKey(t *testing.T) {
	t.Parallel()
	tests := []struct {
		key     string
		want    Principal
		wantErr string
	}{
		{"bot:bot_abc123", Principal{PrincipalBot, "bot_abc123"}, ""},
		{"anonymous:ip:203.0.113.7", Principal{PrincipalAnonymous, "ip:203.0.113.7"}, ""},
		{"api_key:ü", Principal{PrincipalAPIKey, "ü"}, ""},
		{"user", Principal{}, `"user" is not a principal key kind:id`},
		{"robot:r2", Principal{}, `kind: "robot" is not one of user|bot|api_key|anonymous`},
		{"user:", Principal{}, "id: must not be empty"},
		{"user:a\nb", Principal{}, `id: "a\nb" has control character U+000A at byte 1`},
	}
	for _, tt := range tests {
		t.Run(tt.key, func(t *testing.T) {
			p, err := ParsePrincipalKey(tt.key)
			if tt.wantErr != "" {
				require.EqualError(t, err, tt.wantErr)
				require.ErrorIs(t, err, ErrInvalid)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, p)
			require.Equal(t, tt.key, p.Key())
		})
	}
}

func TestHelpers(t *testing.T) {
	t.Parallel()
	t.Run("ValidID", func(t *testing.T) {
		require.NoError(t, ValidID("01JDK3W7Q5Z8X2M4N6P8R0T2V4"))
		require.NoError(t, ValidID("550e8400-e29b-41d4-a716-446655440000"))
		require.NoError(t, ValidID(strings.Repeat("a", 64)))
		require.ErrorIs(t, ValidID(strings.Repeat("a", 65)), ErrInvalid)
		require.EqualError(t, ValidID("a.b"), `"a.b" has '.' at byte 1; allowed are A-Z a-z 0-9 _ -`)
		require.EqualError(t, ValidID(""), "must not be empty")
	})
	t.Run("ValidResource", func(t *testing.T) {
		for _, ok := range []string{"channel:123", "a:b", "guild_2:x:y", "file:/a/b?c"} {
			require.NoError(t, ValidResource(ok), ok)
		}
		for _, bad := range []string{"", "channel", ":123", "Channel:1", "channel:", "channel: 1", "channel:é", "1abc:x", "a-b:1"} {
			require.ErrorIs(t, ValidResource(bad), ErrInvalid, bad)
		}
	})
	t.Run("ValidMethod", func(t *testing.T) {
		for _, m := range strings.Split(Methods, "|") {
			require.NoError(t, ValidMethod(m))
		}
		require.EqualError(t, ValidMethod("TRACE"), `"TRACE" is not one of GET|HEAD|POST|PUT|PATCH|DELETE|OPTIONS`)
	})
	t.Run("ValidPrincipalID", func(t *testing.T) {
		require.NoError(t, ValidPrincipalID(strings.Repeat("é", 64)))
		require.ErrorIs(t, ValidPrincipalID(strings.Repeat("é", 65)), ErrInvalid)
		require.ErrorIs(t, ValidPrincipalID("a\u007fb"), ErrInvalid)
	})
	t.Run("enums", func(t *testing.T) {
		require.True(t, PrincipalAPIKey.Valid())
		require.False(t, PrincipalKind("API_KEY").Valid())
		require.True(t, TierPenalty.Valid())
		require.False(t, Tier("").Valid())
		require.True(t, PatternScraping.Valid())
		require.True(t, SeverityCritical.Valid())
		require.True(t, PenaltySimulated.Valid())
		require.True(t, ActorOperator.Valid())
		require.False(t, ActorKind("cron").Valid())
	})
}

func TestKafkaKeys(t *testing.T) {
	t.Parallel()
	d, err := DecodeDecision(loadExample(t, "decision.v1.allowed"))
	require.NoError(t, err)
	require.Equal(t, "bot:bot_abc123", d.Key())
	a, err := DecodeAbuse(loadExample(t, "abuse.v1.rapid_fire"))
	require.NoError(t, err)
	require.Equal(t, "bot:bot_abc123", a.Key())
	j, err := DecodeAdjustment(loadExample(t, "adjustment.v1"))
	require.NoError(t, err)
	require.Equal(t, "route:POST /channels/{channel_id}/messages", j.Key())
}

func TestErrorsIs(t *testing.T) {
	t.Parallel()
	err := error(&ValidationError{Type: TypeDecision, Field: "x", Reason: "y"})
	require.True(t, errors.Is(err, ErrInvalid))
	require.False(t, errors.Is(err, errors.New("invalid event")))
	wrapped := errors.Join(errors.New("consume"), err)
	require.ErrorIs(t, wrapped, ErrInvalid)
}

// TestStringScan reads a string whose first byte that is not plain ASCII
// sits at every offset of rawString's eight-byte steps, with bytes after it
// that a borrow from it could make look special too.
func TestStringScan(t *testing.T) {
	t.Parallel()
	for _, tt := range []struct {
		name, body, want string // the literal is `"` + prefix + body (closing quote included)
		bad              bool
	}{
		{name: "end", body: `"`, want: ""},
		{name: "escape", body: `\n"`, want: "\n"},
		{name: "unicode escape", body: `\u00e9"`, want: "é"},
		{name: "utf-8", body: "é\"", want: "é"},
		{name: "del", body: "\x7f\"", want: "\x7f"},
		{name: "control", body: "\x01\"", bad: true},
		{name: "invalid utf-8", body: "\xff\"", bad: true},
		{name: "unterminated", body: "bcd", bad: true},
	} {
		t.Run(tt.name, func(t *testing.T) {
			for n := range 24 {
				prefix := strings.Repeat("a", n)
				for _, after := range []string{"", "\x01\\\"\xff,\"x\":1}"} {
					d := &decoder{data: []byte(`"` + prefix + tt.body + after)}
					got, err := d.rawString()
					if tt.bad {
						require.NotNil(t, err, "prefix %d", n)
						continue
					}
					require.Nil(t, err, "prefix %d", n)
					require.Equal(t, prefix+tt.want, string(got), "prefix %d", n)
					require.Equal(t, 1+n+len(tt.body), d.pos, "prefix %d", n)
				}
			}
		})
	}
}
