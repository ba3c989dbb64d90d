package events

import (
	"encoding/binary"
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"strings"
	"time"
	"unicode/utf16"
	"unicode/utf8"
)

// decoder is a strict, allocation-light JSON reader for one event. It accepts
// I-JSON (RFC 7493): UTF-8 only, no lone surrogates, no duplicate member names
// among the members it knows; unknown members are skipped after a syntax check.
type decoder struct {
	data []byte
	pos  int
	typ  string           // event type, for error messages
	buf  []byte           // scratch space for strings with escapes
	err  *ValidationError // the first error of a generated decoder (members.go)
}

// maxDepth bounds the nesting of skipped values, as encoding/json does.
const maxDepth = 10000

// syntax returns a malformed-JSON error at the current position.
func (d *decoder) syntax(msg string) *ValidationError {
	return &ValidationError{Type: d.typ, Reason: fmt.Sprintf(syntaxPrefix+"%s at offset %d", msg, d.pos)}
}

func (d *decoder) unexpected(context string) *ValidationError {
	if d.pos >= len(d.data) {
		return d.syntax("unexpected end of input")
	}
	c := d.data[d.pos]
	if c < utf8.RuneSelf {
		return d.syntax(fmt.Sprintf("invalid character %q %s", c, context))
	}
	return d.syntax(fmt.Sprintf("invalid byte 0x%02x %s", c, context))
}

func (d *decoder) ws() {
	for d.pos < len(d.data) {
		if c := d.data[d.pos]; c > ' ' || c != ' ' && c != '\t' && c != '\n' && c != '\r' {
			return
		}
		d.pos++
	}
}

// peek skips white space and returns the next byte, 0 at the end.
func (d *decoder) peek() byte {
	d.ws()
	if d.pos < len(d.data) {
		return d.data[d.pos]
	}
	return 0
}

// wrongType reports that the value at the current position is not a want, or
// a syntax error if it is not a value at all.
func (d *decoder) wrongType(field, want string) *ValidationError {
	var got string
	switch d.peek() {
	case '"':
		got = "a string"
	case '{':
		got = "an object"
	case '[':
		got = "an array"
	case 't', 'f':
		got = "a boolean"
	case 'n':
		got = "null"
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		got = "a number"
	default:
		return d.unexpected("looking for beginning of value")
	}
	return &ValidationError{Type: d.typ, Field: field, Reason: "must be " + want + ", got " + got}
}

func (d *decoder) invalid(field string, e *ValidationError) *ValidationError {
	e.Type = d.typ
	return at(field, e)
}

// syntaxPrefix starts the Reason of every malformed-JSON error.
const syntaxPrefix = "invalid JSON: "

func isSyntax(e *ValidationError) bool {
	return len(e.Reason) >= len(syntaxPrefix) && e.Reason[:len(syntaxPrefix)] == syntaxPrefix
}

// within puts a member error of an array element under the element's path;
// syntax errors stay about the whole document.
func within(path string, e *ValidationError) *ValidationError {
	if isSyntax(e) {
		return e
	}
	return at(path, e)
}

// end checks that nothing but white space follows the top-level value.
func (d *decoder) end() *ValidationError {
	d.ws()
	if d.pos != len(d.data) {
		return d.unexpected("after top-level value")
	}
	return nil
}

// opening reads c, the '{' or '[' that opens the value of field, which must
// be want ("an object", "an array").
func (d *decoder) opening(c byte, field, want string) *ValidationError {
	if d.peek() != c {
		return d.wrongType(field, want)
	}
	d.pos++
	return nil
}

// member advances to the next member of the current object and reads its name
// and the colon; ok is false at the closing '}' and after an error, which it
// keeps in d.err. first must start out true. The name aliases the input or
// d.buf: use it before reading anything else.
func (d *decoder) member(first *bool) (name []byte, ok bool) {
	if d.err != nil {
		return nil, false
	}
	switch d.peek() {
	case '}':
		d.pos++
		return nil, false
	case ',':
		if *first {
			d.err = d.unexpected("looking for beginning of object key string")
			return nil, false
		}
		d.pos++
		if d.peek() != '"' {
			d.err = d.unexpected("looking for beginning of object key string")
			return nil, false
		}
	case '"':
		if !*first {
			d.err = d.unexpected("after object key:value pair")
			return nil, false
		}
	default:
		if *first {
			d.err = d.unexpected("looking for beginning of object key string")
			return nil, false
		}
		d.err = d.unexpected("after object key:value pair")
		return nil, false
	}
	*first = false
	name, err := d.rawString()
	if err != nil {
		d.err = err
		return nil, false
	}
	if d.peek() != ':' {
		d.err = d.unexpected("after object key")
		return nil, false
	}
	d.pos++
	return name, true
}

// rawString reads the string at d.pos (which must be '"') and returns its
// content, aliasing d.data when it has no escapes and d.buf otherwise.
func (d *decoder) rawString() ([]byte, *ValidationError) {
	start := d.pos + 1
	i := start
	for {
		// Skip plain ASCII: eight bytes at a time while none of them is a
		// control character, '"', '\\' or non-ASCII, then byte by byte.
		for i+8 <= len(d.data) {
			x := binary.LittleEndian.Uint64(d.data[i:])
			q := x ^ (lsb * '"')
			s := x ^ (lsb * '\\')
			if (x|(x-lsb*0x20)|(q-lsb)|(s-lsb))&msb != 0 {
				break
			}
			i += 8
		}
		for i < len(d.data) && plain(d.data[i]) {
			i++
		}
		if i >= len(d.data) {
			d.pos = len(d.data)
			return nil, d.syntax("unexpected end of input")
		}
		switch c := d.data[i]; {
		case c == '"':
			d.pos = i + 1
			return d.data[start:i], nil
		case c == '\\':
			return d.escapedString(start, i)
		case c < 0x20:
			d.pos = i
			return nil, d.syntax(fmt.Sprintf("invalid character %q in string literal", c))
		default:
			r, size := utf8.DecodeRune(d.data[i:])
			if r == utf8.RuneError && size == 1 {
				d.pos = i
				return nil, d.syntax("invalid UTF-8 in string")
			}
			i += size
		}
	}
}

const (
	lsb = 0x0101010101010101
	msb = 0x8080808080808080
)

// plain reports whether a string may hold c unescaped with no further look:
// ASCII other than control characters, '"' and '\\'.
func plain(c byte) bool { return c >= 0x20 && c < utf8.RuneSelf && c != '"' && c != '\\' }

// escapedString continues rawString from the first backslash at i.
func (d *decoder) escapedString(start, i int) ([]byte, *ValidationError) {
	b := append(d.buf[:0], d.data[start:i]...)
	for i < len(d.data) {
		c := d.data[i]
		switch {
		case c == '"':
			d.pos = i + 1
			d.buf = b
			return b, nil
		case c < 0x20:
			d.pos = i
			return nil, d.syntax(fmt.Sprintf("invalid character %q in string literal", c))
		case c == '\\':
			if i+1 >= len(d.data) {
				d.pos = len(d.data)
				return nil, d.syntax("unexpected end of input")
			}
			switch e := d.data[i+1]; e {
			case '"', '\\', '/', 'b', 'f', 'n', 'r', 't':
				// The character each escape stands for, in the order of
				// escapes: '"' for \", '\b' for \b, …
				const escapes, escaped = `"\/bfnrt`, "\"\\/\b\f\n\r\t"
				b = append(b, escaped[strings.IndexByte(escapes, e)])
				i += 2
			case 'u':
				r, ok := hex4(d.data, i+2)
				if !ok {
					d.pos = i
					return nil, d.syntax("invalid \\u escape in string")
				}
				i += 6
				if utf16.IsSurrogate(r) {
					r2, ok := rune(0), false
					if r < 0xdc00 && i+1 < len(d.data) && d.data[i] == '\\' && d.data[i+1] == 'u' {
						r2, ok = hex4(d.data, i+2)
					}
					dec := utf16.DecodeRune(r, r2)
					if !ok || dec == utf8.RuneError {
						d.pos = i - 6
						return nil, d.syntax("lone UTF-16 surrogate in string")
					}
					r = dec
					i += 6
				}
				b = utf8.AppendRune(b, r)
			default:
				d.pos = i
				return nil, d.syntax(fmt.Sprintf("invalid escape %q in string", "\\"+string(rune(e))))
			}
		case c < utf8.RuneSelf:
			b = append(b, c)
			i++
		default:
			r, size := utf8.DecodeRune(d.data[i:])
			if r == utf8.RuneError && size == 1 {
				d.pos = i
				return nil, d.syntax("invalid UTF-8 in string")
			}
			b = append(b, d.data[i:i+size]...)
			i += size
		}
	}
	d.pos = len(d.data)
	return nil, d.syntax("unexpected end of input")
}

func hex4(b []byte, i int) (rune, bool) {
	if i+4 > len(b) {
		return 0, false
	}
	var r rune
	for _, c := range b[i : i+4] {
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c = c - 'a' + 10
		case 'A' <= c && c <= 'F':
			c = c - 'A' + 10
		default:
			return 0, false
		}
		r = r<<4 | rune(c)
	}
	return r, true
}

// strBytes reads a string member's content without allocating; the result is
// only valid until the next read.
func (d *decoder) strBytes(field string) ([]byte, *ValidationError) {
	if d.peek() != '"' {
		return nil, d.wrongType(field, "a string")
	}
	return d.rawString()
}

func (d *decoder) str(field string) (string, *ValidationError) {
	b, err := d.strBytes(field)
	return string(b), err
}

// constant reads a string that must equal want (the "type" member).
func (d *decoder) constant(field, want string) *ValidationError {
	b, err := d.strBytes(field)
	if err != nil {
		return err
	}
	if string(b) != want {
		return d.invalid(field, reason(fmt.Sprintf("must be %q, got %s", want, quote(string(b)))))
	}
	return nil
}

func (d *decoder) time(field string) (time.Time, *ValidationError) {
	return parsed(d, field, parseTime[[]byte])
}

func (d *decoder) ip(field string) (netip.Addr, *ValidationError) {
	return parsed(d, field, parseIP[[]byte])
}

// parsed reads a string member and parses it with parse.
func parsed[T any](d *decoder, field string, parse func([]byte) (T, *ValidationError)) (T, *ValidationError) {
	b, err := d.strBytes(field)
	if err == nil {
		var v T
		if v, err = parse(b); err == nil {
			return v, nil
		}
		err = d.invalid(field, err)
	}
	var zero T
	return zero, err
}

func (d *decoder) boolean(field string) (bool, *ValidationError) {
	switch d.peek() {
	case 't':
		return true, d.literal("true")
	case 'f':
		return false, d.literal("false")
	}
	return false, d.wrongType(field, "a boolean")
}

// numberLit reads a JSON number and returns its text.
func (d *decoder) numberLit() ([]byte, *ValidationError) {
	start, i, n := d.pos, d.pos, len(d.data)
	fail := func(at int) ([]byte, *ValidationError) {
		d.pos = at
		return nil, d.unexpected("in numeric literal")
	}
	if i < n && d.data[i] == '-' {
		i++
	}
	switch {
	case i < n && d.data[i] == '0':
		i++
	case i < n && '1' <= d.data[i] && d.data[i] <= '9':
		for i++; i < n && isDigit(d.data[i]); i++ {
		}
	default:
		return fail(i)
	}
	if i < n && d.data[i] == '.' {
		i++
		if i >= n || !isDigit(d.data[i]) {
			return fail(i)
		}
		for i++; i < n && isDigit(d.data[i]); i++ {
		}
	}
	if i < n && (d.data[i] == 'e' || d.data[i] == 'E') {
		i++
		if i < n && (d.data[i] == '+' || d.data[i] == '-') {
			i++
		}
		if i >= n || !isDigit(d.data[i]) {
			return fail(i)
		}
		for i++; i < n && isDigit(d.data[i]); i++ {
		}
	}
	d.pos = i
	return d.data[start:i], nil
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func (d *decoder) numberStart(field, want string) *ValidationError {
	switch d.peek() {
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		return nil
	}
	return d.wrongType(field, want)
}

// integer reads an integer member within [lo, hi] (hi <= MaxSafeInteger). Like
// JSON Schema, it takes any number whose value is an integer: 3, 3.0 and 3e0.
func (d *decoder) integer(field string, lo, hi int64) (int64, *ValidationError) {
	if err := d.numberStart(field, "an integer"); err != nil {
		return 0, err
	}
	lit, err := d.numberLit()
	if err != nil {
		return 0, err
	}
	v, isInt, fits := parseIntLit(lit)
	switch {
	case !isInt:
		return 0, d.invalid(field, reason("must be an integer, got "+quote(string(lit))))
	case !fits || v < lo || v > hi:
		return 0, d.invalid(field, reason(fmt.Sprintf("must be between %d and %d, got %s", lo, hi, quote(string(lit)))))
	}
	return v, nil
}

// parseIntLit returns the value of a JSON number literal when it is an integer
// (isInt) of at most 16 digits (fits); 10^16 > MaxSafeInteger.
func parseIntLit(lit []byte) (v int64, isInt, fits bool) {
	neg := lit[0] == '-'
	digits := lit
	if neg {
		digits = lit[1:]
	}
	if len(digits) <= 16 {
		plain := true
		for _, c := range digits {
			if !isDigit(c) {
				plain = false
				break
			}
			v = v*10 + int64(c-'0')
		}
		if plain {
			if neg {
				v = -v
			}
			return v, true, true
		}
	}
	dec := parseDecimal(lit)
	if dec.zero {
		return 0, true, true
	}
	if dec.exp < 0 {
		return 0, false, false
	}
	if len(dec.digits)+dec.exp > 16 {
		return 0, true, false
	}
	v = 0
	for _, c := range dec.digits {
		v = v*10 + int64(c-'0')
	}
	for range dec.exp {
		v *= 10
	}
	if dec.neg {
		v = -v
	}
	return v, true, true
}

// decimal is a JSON number literal as ±digits × 10^exp, digits without leading
// or trailing zeros.
type decimal struct {
	neg    bool
	zero   bool
	digits []byte
	exp    int
}

// parseDecimal analyses a literal that numberLit accepted.
func parseDecimal(lit []byte) decimal {
	var dec decimal
	i := 0
	if lit[0] == '-' {
		dec.neg = true
		i++
	}
	intStart := i
	for i < len(lit) && isDigit(lit[i]) {
		i++
	}
	intPart := lit[intStart:i]
	var frac []byte
	if i < len(lit) && lit[i] == '.' {
		i++
		fs := i
		for i < len(lit) && isDigit(lit[i]) {
			i++
		}
		frac = lit[fs:i]
	}
	exp := 0
	if i < len(lit) { // 'e' or 'E'
		i++
		eneg := false
		if lit[i] == '+' || lit[i] == '-' {
			eneg = lit[i] == '-'
			i++
		}
		for ; i < len(lit); i++ {
			if exp < 1e9 { // saturate: anything beyond is out of every range
				exp = exp*10 + int(lit[i]-'0')
			}
		}
		if eneg {
			exp = -exp
		}
	}
	all := make([]byte, 0, len(intPart)+len(frac))
	all = append(append(all, intPart...), frac...)
	exp -= len(frac)
	for len(all) > 0 && all[0] == '0' {
		all = all[1:]
	}
	if len(all) == 0 {
		dec.zero = true
		return dec
	}
	for all[len(all)-1] == '0' {
		all = all[:len(all)-1]
		exp++
	}
	dec.digits, dec.exp = all, exp
	return dec
}

// cmpPow10 compares a non-zero positive decimal with 10^k.
func (dec decimal) cmpPow10(k int) int {
	mag := len(dec.digits) - 1 + dec.exp // 10^mag <= value < 10^(mag+1)
	switch {
	case mag < k:
		return -1
	case mag > k:
		return 1
	case len(dec.digits) == 1 && dec.digits[0] == '1':
		return 0
	}
	return 1
}

// float reads a number member. Every float bound in the contracts is 0, 1 or 10
// and JSON Schema compares exactly, so when the nearest float64 is one of those
// values but the literal is not exactly it (1.0000000000000000001, 1e-400), the
// result is moved one ulp towards the literal: range checks on the float then
// agree with the schema.
func (d *decoder) float(field string) (float64, *ValidationError) {
	if err := d.numberStart(field, "a number"); err != nil {
		return 0, err
	}
	lit, err := d.numberLit()
	if err != nil {
		return 0, err
	}
	f, perr := strconv.ParseFloat(string(lit), 64)
	if perr != nil || math.IsInf(f, 0) {
		return 0, d.invalid(field, reason(quote(string(lit))+" is out of range of a 64-bit float"))
	}
	if f == 0 || f == 1 || f == 10 {
		if c := cmpExact(lit, f); c != 0 {
			f = math.Nextafter(f, math.Inf(c))
		}
	}
	return f, nil
}

// cmpExact compares the exact value of lit with f, which is 0, 1 or 10.
func cmpExact(lit []byte, f float64) int {
	if isSimple(lit) {
		return 0
	}
	dec := parseDecimal(lit)
	switch {
	case dec.zero && f == 0:
		return 0
	case dec.neg:
		return -1
	case dec.zero, f == 0:
		if dec.zero {
			return -1
		}
		return 1
	case f == 1:
		return dec.cmpPow10(0)
	default:
		return dec.cmpPow10(1)
	}
}

// isSimple reports whether lit is exact in float64 at a glance: an optional
// minus, at most 15 integer digits, and a fraction of zeros only.
func isSimple(lit []byte) bool {
	i := 0
	if lit[0] == '-' {
		i++
	}
	n := 0
	for i < len(lit) && isDigit(lit[i]) {
		i++
		n++
	}
	if n > 15 {
		return false
	}
	if i < len(lit) && lit[i] == '.' {
		for i++; i < len(lit) && lit[i] == '0'; i++ {
		}
	}
	return i == len(lit)
}

// skip reads and discards any value, checking its syntax.
func (d *decoder) skip(depth int) *ValidationError {
	if depth > maxDepth {
		return d.syntax("exceeded max depth")
	}
	switch d.peek() {
	case '"':
		_, err := d.rawString()
		return err
	case '{':
		d.pos++
		first := true
		for {
			_, ok := d.member(&first)
			if d.err != nil {
				return d.err
			}
			if !ok {
				return nil
			}
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
	case '[':
		d.pos++
		first := true
		for {
			ok, err := d.element(&first)
			if err != nil {
				return err
			}
			if !ok {
				return nil
			}
			if err := d.skip(depth + 1); err != nil {
				return err
			}
		}
	case 't':
		return d.literal("true")
	case 'f':
		return d.literal("false")
	case 'n':
		return d.literal("null")
	case '-', '0', '1', '2', '3', '4', '5', '6', '7', '8', '9':
		_, err := d.numberLit()
		return err
	}
	return d.unexpected("looking for beginning of value")
}

func (d *decoder) literal(lit string) *ValidationError {
	for i := 0; i < len(lit); i++ {
		if d.pos >= len(d.data) || d.data[d.pos] != lit[i] {
			return d.unexpected("in literal " + lit)
		}
		d.pos++
	}
	return nil
}

// element advances to the next element of the current array; ok is false at
// the closing ']'. first must start out true.
func (d *decoder) element(first *bool) (ok bool, err *ValidationError) {
	switch d.peek() {
	case ']':
		d.pos++
		return false, nil
	case ',':
		if *first {
			return false, d.unexpected("looking for beginning of value")
		}
		d.pos++
		if c := d.peek(); c == ']' {
			return false, d.unexpected("looking for beginning of value")
		}
		return true, nil
	}
	if !*first {
		return false, d.unexpected("after array element")
	}
	*first = false
	return true, nil
}

// req pairs a required member name with its property's bit in a seen mask
// (members.seen), in the order of the schema's "required" list.
type req struct {
	bit  uint
	name string
}

// required reports the first required member missing from seen.
func (d *decoder) required(prefix string, seen uint32, fields []req) *ValidationError {
	for _, f := range fields {
		if seen&(1<<f.bit) == 0 {
			name := f.name
			if prefix != "" {
				name = prefix + "." + name
			}
			return &ValidationError{Type: d.typ, Field: name, Reason: "is required"}
		}
	}
	return nil
}

// tooManyItems is the error of an array with more than max items.
func (d *decoder) tooManyItems(field string, max int) *ValidationError {
	return d.invalid(field, reason("has more than "+strconv.Itoa(max)+" items"))
}
