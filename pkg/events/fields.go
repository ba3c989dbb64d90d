package events

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"unicode/utf8"
)

// MaxSafeInteger is the largest integer that every JSON implementation reads
// exactly (2^53-1, as I-JSON recommends); no integer in an event may exceed it.
const MaxSafeInteger = 1<<53 - 1

// The limits of strings and arrays (MaxIDLen, MaxRouteLen, …) are generated
// from the schemas' maxLength and maxItems (x-floodgate-max-const).

// ValidID reports whether s is a valid event id: 1–64 characters of
// [A-Za-z0-9_-] (a UUID, ULID or similar).
func ValidID(s string) error { return asError(validID(s)) }

func validID(s string) *ValidationError {
	return validName(s, MaxIDLen, false)
}

// validName checks 1–max characters of [A-Za-z0-9_-], and '.' when dot.
func validName(s string, max int, dot bool) *ValidationError {
	if err := sized(s, max, "%s is %d characters long, the limit is %d"); err != nil {
		return err
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isIDByte(c) && !(dot && c == '.') {
			what := "A-Z a-z 0-9 _ -"
			if dot {
				what = "A-Z a-z 0-9 . _ -"
			}
			return reason(fmt.Sprintf("%s has %s at byte %d; allowed are %s", quote(s), quoteRuneAt(s, i), i, what))
		}
	}
	return nil
}

func isIDByte(c byte) bool {
	return 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '_' || c == '-'
}

// ValidRoute reports whether s is a templated route: an RFC 3986 absolute path
// with parameters. It starts with "/", is at most 256 bytes, has no query
// string and no empty segment (no "//", no trailing slash) except the lone
// route "/". A segment is a run of literal characters — RFC 3986 pchar:
// A-Z a-z 0-9 - . _ ~, the sub-delims ! $ & ' ( ) * + , ; =, ":" and "@", and
// percent-encoded bytes %XX — and parameters "{name}" with name
// [A-Za-z_][A-Za-z0-9_-]*, mixed as OpenAPI path templating allows, except that
// two parameters may not touch ("{a}{b}" cannot be split). Examples:
// "/channels/{channel_id}/messages", "/users/@me",
// "/2010-04-01/Accounts/{AccountSid}/Messages/{Sid}.json", "/v1/{name}:cancel".
func ValidRoute(s string) error { return asError(validRoute(s)) }

// RouteGrammar is the route grammar in words, for error messages and docs.
const RouteGrammar = "segments of RFC 3986 path characters (A-Z a-z 0-9 - . _ ~ ! $ & ' ( ) * + , ; = : @ and %XX) and {name} parameters, name [A-Za-z_][A-Za-z0-9_-]*"

func validRoute(s string) *ValidationError {
	switch {
	case s == "":
		return reason("must not be empty")
	case len(s) > MaxRouteLen:
		return reason(fmt.Sprintf("%s is %d bytes long, the limit is %d", quote(s), len(s), MaxRouteLen))
	case s[0] != '/':
		return reason(fmt.Sprintf("%s does not start with \"/\"", quote(s)))
	case s == "/":
		return nil
	}
	segStart := 1      // first byte of the current segment
	prevParam := false // the previous item of this segment was a parameter
	for i := 1; i <= len(s); {
		if i == len(s) || s[i] == '/' {
			if i == segStart {
				return reason(fmt.Sprintf("%s has an empty segment at byte %d", quote(s), segStart))
			}
			i++
			segStart, prevParam = i, false
			continue
		}
		switch c := s[i]; {
		case c == '{':
			if prevParam {
				return reason(fmt.Sprintf("%s has two parameters with nothing between them at byte %d; they cannot be told apart", quote(s), i))
			}
			j := i + 1
			for j < len(s) && s[j] != '}' && s[j] != '/' {
				j++
			}
			if j == len(s) || s[j] != '}' || !validParamName(s[i+1:j]) {
				end := j
				if end < len(s) && s[end] == '}' {
					end++
				}
				return reason(fmt.Sprintf("%s has an invalid parameter %s at byte %d; parameters are {name} with name [A-Za-z_][A-Za-z0-9_-]*", quote(s), quote(s[i:end]), i))
			}
			i, prevParam = j+1, true
		case c == '%':
			if i+2 >= len(s) || !isHex(s[i+1]) || !isHex(s[i+2]) {
				return reason(fmt.Sprintf("%s has %s at byte %d that does not start a percent-encoded byte %%XX", quote(s), quoteRuneAt(s, i), i))
			}
			i, prevParam = i+3, false
		case isRouteLiteralByte(c):
			i, prevParam = i+1, false
		case c == '?':
			return reason(fmt.Sprintf("%s has a query string; routes are paths only", quote(s)))
		default:
			return reason(fmt.Sprintf("%s has %s at byte %d; routes are %s", quote(s), quoteRuneAt(s, i), i, RouteGrammar))
		}
	}
	return nil
}

// isRouteLiteralByte reports whether c is an RFC 3986 pchar other than a
// percent-encoding: unreserved, sub-delims, ":" or "@".
func isRouteLiteralByte(c byte) bool {
	if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
		return true
	}
	switch c {
	case '-', '.', '_', '~', '!', '$', '&', '\'', '(', ')', '*', '+', ',', ';', '=', ':', '@':
		return true
	}
	return false
}

func isHex(c byte) bool {
	return '0' <= c && c <= '9' || 'a' <= c && c <= 'f' || 'A' <= c && c <= 'F'
}

func validParamName(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case 'a' <= c && c <= 'z', 'A' <= c && c <= 'Z', c == '_':
		case ('0' <= c && c <= '9' || c == '-') && i > 0:
		default:
			return false
		}
	}
	return name != ""
}

// ValidIP reports whether s is an IPv4 or IPv6 address literal as net/netip
// parses it, without a zone: "203.0.113.7", "2001:db8::1", "::ffff:192.0.2.1".
func ValidIP(s string) error {
	_, err := ParseIP(s)
	return err
}

// ParseIP parses s as ValidIP accepts it.
func ParseIP(s string) (netip.Addr, error) {
	a, err := parseIP(s)
	return a, asError(err)
}

func parseIP[S ~string | ~[]byte](s S) (netip.Addr, *ValidationError) {
	v6 := false
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case '%':
			return netip.Addr{}, reason(fmt.Sprintf("%s has a zone; zones are not allowed", quote(string(s))))
		case ':':
			v6 = true
		}
	}
	if !v6 {
		if a, ok := parseIPv4(s); ok {
			return a, nil
		}
	} else if a, err := netip.ParseAddr(string(s)); err == nil {
		return a, nil
	}
	return netip.Addr{}, reason(fmt.Sprintf("%s is not an IPv4 or IPv6 address", quote(string(s))))
}

// parseIPv4 parses dotted decimal exactly as netip.ParseAddr does (four fields
// of 0–255, no leading zeros), without allocating.
func parseIPv4[S ~string | ~[]byte](s S) (netip.Addr, bool) {
	var ip [4]byte
	field, n, digits := 0, 0, 0
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case '0' <= c && c <= '9':
			if digits > 0 && n == 0 { // leading zero
				return netip.Addr{}, false
			}
			n = n*10 + int(c-'0')
			digits++
			if n > 255 {
				return netip.Addr{}, false
			}
		case c == '.':
			if digits == 0 || field == 3 {
				return netip.Addr{}, false
			}
			ip[field] = byte(n)
			field++
			n, digits = 0, 0
		default:
			return netip.Addr{}, false
		}
	}
	if field != 3 || digits == 0 {
		return netip.Addr{}, false
	}
	ip[3] = byte(n)
	return netip.AddrFrom4(ip), true
}

func validAddr(a netip.Addr) *ValidationError {
	switch {
	case !a.IsValid():
		return reason("is required")
	case a.Zone() != "":
		return reason(fmt.Sprintf("%s has a zone; zones are not allowed", quote(a.String())))
	}
	return nil
}

// ValidResource reports whether s is a resource reference "type:id": type is
// [a-z][a-z0-9_]*, id is one or more visible ASCII characters (0x21–0x7E), and the
// whole is at most 128 bytes. Example: "channel:123".
func ValidResource(s string) error { return asError(validResource(s)) }

func validResource(s string) *ValidationError {
	if err := sized(s, MaxResourceLen, "%s is %d bytes long, the limit is %d"); err != nil {
		return err
	}
	colon := strings.IndexByte(s, ':')
	if colon < 1 || colon == len(s)-1 || s[0] < 'a' || s[0] > 'z' {
		return reason(fmt.Sprintf("%s is not of the form type:id, e.g. \"channel:123\"", quote(s)))
	}
	for i := 1; i < colon; i++ {
		if c := s[i]; !('a' <= c && c <= 'z' || '0' <= c && c <= '9' || c == '_') {
			return reason(fmt.Sprintf("%s has %s at byte %d; the type is [a-z][a-z0-9_]*", quote(s), quoteRuneAt(s, i), i))
		}
	}
	for i := colon + 1; i < len(s); i++ {
		if c := s[i]; c < '!' || c > '~' {
			return reason(fmt.Sprintf("%s has %s at byte %d; the id is visible ASCII", quote(s), quoteRuneAt(s, i), i))
		}
	}
	return nil
}

// ValidMethod reports whether s is one of Methods (upper case).
func ValidMethod(s string) error {
	if isEnum(enumMethod, s) {
		return nil
	}
	return oneOf(s, Methods)
}

// oneOf checks s against the "|"-separated options.
func oneOf(s, options string) *ValidationError {
	for opts := options; ; {
		opt, rest, more := strings.Cut(opts, "|")
		if s == opt {
			return nil
		}
		if !more {
			break
		}
		opts = rest
	}
	if s == "" {
		return reason("must be one of " + options)
	}
	return reason(fmt.Sprintf("%s is not one of %s", quote(s), options))
}

// ValidPrincipalID reports whether s is a valid principal id: 1–128 bytes of
// UTF-8 without control characters.
func ValidPrincipalID(s string) error { return asError(validPrincipalID(s)) }

func validPrincipalID(s string) *ValidationError {
	if err := sized(s, MaxPrincipalIDLen, "%s is %d bytes long, the limit is %d bytes"); err != nil {
		return err
	}
	return noControl(s, false)
}

// sized checks that s is not empty and at most max bytes long; tooLong
// formats the error of a longer s from s quoted, its length and max.
func sized(s string, max int, tooLong string) *ValidationError {
	if s == "" {
		return reason("must not be empty")
	}
	if len(s) > max {
		return reason(fmt.Sprintf(tooLong, quote(s), len(s), max))
	}
	return nil
}

// validText checks a free-text field: 1–max characters (Unicode code points, as
// JSON Schema's maxLength counts them), valid UTF-8, no control characters
// (Unicode category Cc) except tab and newline when multiline.
func validText(s string, max int, multiline bool) *ValidationError {
	if s == "" {
		return reason("must not be empty")
	}
	if err := noControl(s, multiline); err != nil {
		return err
	}
	if n := utf8.RuneCountInString(s); n > max {
		return reason(fmt.Sprintf("%s is %d characters long, the limit is %d", quote(s), n, max))
	}
	return nil
}

// noControl rejects invalid UTF-8 and control characters (U+0000–U+001F,
// U+007F–U+009F), allowing tab and newline when multiline.
func noControl(s string, multiline bool) *ValidationError {
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c < 0x20 && !(multiline && (c == '\t' || c == '\n')) || c == 0x7f {
				return reason(fmt.Sprintf("%s has control character %U at byte %d", quote(s), c, i))
			}
			i++
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			return reason(fmt.Sprintf("%s is not valid UTF-8 at byte %d", quote(s), i))
		}
		if r <= 0x9f {
			return reason(fmt.Sprintf("%s has control character %U at byte %d", quote(s), r, i))
		}
		i += size
	}
	return nil
}

// quoteRuneAt quotes the character starting at byte i of s.
func quoteRuneAt(s string, i int) string {
	r, _ := utf8.DecodeRuneInString(s[i:])
	return strconv.QuoteRune(r)
}

func intRange(v, min, max int64) *ValidationError {
	if v < min || v > max {
		return reason(fmt.Sprintf("must be between %d and %d, got %d", min, max, v))
	}
	return nil
}

// ValidTopic reports whether s is a Kafka topic name: 1–249 characters of
// [A-Za-z0-9._-].
func ValidTopic(s string) error { return asError(validTopic(s)) }

func validTopic(s string) *ValidationError {
	return validName(s, MaxTopicLen, true)
}

// tooMany reports an array longer than its maxItems.
func tooMany(n, max int) *ValidationError {
	return reason("has " + strconv.Itoa(n) + " items, the limit is " + strconv.Itoa(max))
}

// Number bounds (minimum, exclusiveMinimum, maximum). Every bound in the
// contracts is 0, 1 or 10; the decoder relies on that to compare boundary
// values exactly (see decoder.float), and eventgen refuses other bounds.

// floatAtLeast checks v >= min (v > min when exclusive) and finite.
func floatAtLeast(v, min float64, exclusive bool) *ValidationError {
	if in := v > min || !exclusive && v == min; !in || math.IsInf(v, 0) {
		return reason("must be a finite number " + minOp(exclusive) + " " + fmtFloat(min) + ", got " + fmtFloat(v))
	}
	return nil
}

// floatRange checks min <= v <= max (min < v when exclusive).
func floatRange(v, min float64, exclusive bool, max float64) *ValidationError {
	if in := v > min || !exclusive && v == min; !in || !(v <= max) {
		return reason("must be " + minOp(exclusive) + " " + fmtFloat(min) + " and <= " + fmtFloat(max) + ", got " + fmtFloat(v))
	}
	return nil
}

func minOp(exclusive bool) string {
	if exclusive {
		return ">"
	}
	return ">="
}

func fmtFloat(v float64) string { return strconv.FormatFloat(v, 'g', -1, 64) }

// validBase64 checks standard, padded base64 (RFC 4648 section 4) of at most
// max characters: what deferred.v1 carries a request body in.
func validBase64(s string, max int) *ValidationError {
	if s == "" {
		return reason("must not be empty")
	}
	if len(s) > max {
		return reason(fmt.Sprintf("is %d characters long, the limit is %d", len(s), max))
	}
	if len(s)%4 != 0 {
		return reason(fmt.Sprintf("is %d characters long, not a multiple of 4: not padded base64", len(s)))
	}
	for i := 0; i < len(s); i++ {
		c := s[i]
		switch {
		case c >= 'A' && c <= 'Z', c >= 'a' && c <= 'z', c >= '0' && c <= '9', c == '+', c == '/':
		case c == '=' && (i == len(s)-1 || i == len(s)-2 && s[len(s)-1] == '='):
		default:
			return reason(fmt.Sprintf("has %s at byte %d: not standard base64", quoteRuneAt(s, i), i))
		}
	}
	return nil
}
