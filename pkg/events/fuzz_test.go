package events

import (
	"net/netip"
	"regexp"
	"strings"
	"testing"
	"time"
	"unicode/utf8"

	"github.com/stretchr/testify/require"
)

// Fuzz targets for every decoder and key builder. Each decoder target checks
// that decoding never panics, that every error is ErrInvalid, that whatever is
// accepted re-encodes and re-decodes to the same event, and that the JSON
// Schema agrees with the decision (outside the documented places where Go is
// stricter). Crashers found by `go test -fuzz` are kept in testdata/fuzz.

func FuzzDecodeDecision(f *testing.F)   { fuzzDecoder(f, TypeDecision) }
func FuzzDecodeAbuse(f *testing.F)      { fuzzDecoder(f, TypeAbuse) }
func FuzzDecodeAdjustment(f *testing.F) { fuzzDecoder(f, TypeAdjustment) }
func FuzzDecodeDeferred(f *testing.F)   { fuzzDecoder(f, TypeDeferred) }

func fuzzDecoder(f *testing.F, typ string) {
	c := codecFor(f, typ)
	schemas := loadSchemas(f, true)
	for _, dir := range []string{"examples", "examples/invalid"} {
		for _, ex := range loadExamples(f, dir) {
			if ex.typ != typ {
				continue
			}
			f.Add(ex.data)
			if v, err := c.decode(ex.data); err == nil {
				enc, err := c.encode(v)
				require.NoError(f, err)
				f.Add(enc) // compact, as on Kafka
				// The same event spelled differently: escaped member names and
				// strings, integers as 1.0 and 1e0.
				alt := strings.NewReplacer(`"type"`, `"\u0074ype"`, `":1,`, `":1.0,`, `":5,`, `":5e0,`, `.v1"`, `\u002ev1"`).Replace(string(enc))
				f.Add([]byte(alt))
			}
		}
	}
	f.Fuzz(func(t *testing.T, data []byte) {
		v, err := c.decode(data)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalid)
			var ve *ValidationError
			require.ErrorAs(t, err, &ve)
			require.Equal(t, typ, ve.Type)
			if isSyntax(ve) || goStricter(ve) {
				return
			}
			require.Error(t, schemas.validate(typ, data), "Go rejects (%v), the schema accepts %q", err, data)
			return
		}
		require.True(t, utf8.Valid(data))
		require.NoError(t, schemas.validate(typ, data), "Go accepts, the schema rejects %q", data)
		enc, err := c.encode(v)
		require.NoError(t, err)
		v2, err := c.decode(enc)
		require.NoError(t, err, "re-encoded: %s", enc)
		require.Equal(t, v, v2)
	})
}

// goStricter recognises the documented rejections the schema cannot express.
func goStricter(ve *ValidationError) bool {
	return ve.Field == "principal.id" && strings.Contains(ve.Reason, "bytes long") ||
		strings.HasSuffix(ve.Reason, "is out of range of a 64-bit float")
}

func FuzzParsePrincipalKey(f *testing.F) {
	for _, s := range []string{"bot:bot_abc123", "anonymous:ip:1.2.3.4", "user:", ":x", "robot:x", "user:a\x00", "api_key:é"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, key string) {
		p, err := ParsePrincipalKey(key)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalid)
			require.Zero(t, p)
			return
		}
		require.Equal(t, key, p.Key())
		require.NoError(t, p.Validate())
	})
}

// seed adds the strings of cases to f's corpus.
func seed(f *testing.F, cases []grammarCase) {
	for _, c := range cases {
		f.Add(c.in)
	}
}

func FuzzParseIP(f *testing.F) {
	re := schemaPattern(f, "ip")
	seed(f, ipCases)
	f.Fuzz(func(t *testing.T, s string) {
		a, err := ParseIP(s)
		want, werr := netip.ParseAddr(s)
		ok := werr == nil && want.Zone() == "" && !strings.Contains(s, "%")
		require.Equal(t, ok, err == nil, "ParseIP(%q): %v", s, err)
		require.Equal(t, ok, re.MatchString(s) && utf8.RuneCountInString(s) <= 45, "schema pattern on %q", s)
		if ok {
			require.Equal(t, want, a)
			require.Nil(t, validAddr(a))
		}
	})
}

func FuzzParseTime(f *testing.F) {
	re := schemaPattern(f, "timestamp")
	seed(f, timeCases)
	f.Fuzz(func(t *testing.T, s string) {
		got, err := ParseTime(s)
		require.Equal(t, err == nil, re.MatchString(s), "ParseTime and the schema pattern on %q: %v", s, err)
		if err != nil {
			require.ErrorIs(t, err, ErrInvalid)
			return
		}
		want, err := time.Parse(TimeLayout, s)
		require.NoError(t, err)
		require.Equal(t, want, got)
		require.Equal(t, s, FormatTime(got))
	})
}

func FuzzValidRoute(f *testing.F) {
	re := schemaPattern(f, "route")
	f.Add("/channels/{channel_id}/messages")
	f.Add("/")
	f.Add("/a//b")
	f.Add("/users/@me")
	f.Add("/2010-04-01/Accounts/{AccountSid}/Messages/{Sid}.json")
	f.Add("/v1/{name}:cancel")
	f.Add("/a%2Fb/{x}{y}")
	f.Fuzz(func(t *testing.T, s string) {
		err := ValidRoute(s)
		require.Equal(t, err == nil, re.MatchString(s) && len(s) <= MaxRouteLen, "ValidRoute(%q): %v", s, err)
	})
}

func schemaPattern(t testing.TB, def string) *regexp.Regexp {
	s := loadSchemas(t, false)
	return regexp.MustCompile(s.raw[TypeDecision]["$defs"].(map[string]any)[def].(map[string]any)["pattern"].(string))
}
