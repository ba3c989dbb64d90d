package events

import (
	"encoding/binary"
	"fmt"
	"math/bits"
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
			if m := (x | (x - lsb*0x20) | (q - lsb) | (s - lsb)) & msb; m != 0 {
				// The lowest byte flagged is the first that is not plain
				// (a borrow only carries up from a flagged byte): step
				// onto it, so the byte loop below has nothing to do.
				i += bits.TrailingZeros64(m) / 8
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
