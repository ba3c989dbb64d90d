package server

import (
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
)

// decodeCheck decodes b, a POST /v1/check body, into req when it is a check
// in the plain form gateways send: one object of CheckRequest's members
// (principal's kind and id inside), each once, named as the contract names
// them, strings of printable ASCII without escapes, cost a plain integer,
// nothing but whitespace around the tokens. For such a body the result is
// json.Unmarshal's, at a fraction of its cost (reflection over the struct
// was 5 % of a check's CPU in the pinned peerbench profile). Anything else —
// another member, a null, an escape, a non-ASCII byte, a number with a
// fraction, a repeat, malformed JSON — returns false with req untouched:
// json decides it, with its own result and error (decodeBody).
//
// The strings decoded share one allocation, a copy of b, instead of one
// each (four or five a check).
func decodeCheck(b []byte, req *checkapi.CheckRequest) bool {
	d := plainReader{b: b}
	var out checkapi.CheckRequest
	var seen uint16
	once := func(bit uint16) bool {
		if seen&bit != 0 {
			return false
		}
		seen |= bit
		return true
	}
	// str reads a string member into dst, once (bit).
	str := func(dst *string, bit uint16) bool {
		v, ok := d.str()
		*dst = v
		return ok && once(bit)
	}
	ok := d.object(func(key []byte) bool {
		switch string(key) {
		case "principal":
			return once(1<<0) && d.object(func(key []byte) bool {
				switch string(key) {
				case "kind":
					k, ok := d.str()
					out.Principal.Kind = events.PrincipalKind(k)
					return ok && once(1<<1)
				case "id":
					return str(&out.Principal.ID, 1<<2)
				}
				return false
			})
		case "cost":
			n, ok := d.int()
			out.Cost = n
			return ok && once(1<<3)
		case "ip":
			return str(&out.IP, 1<<4)
		case "method":
			return str(&out.Method, 1<<5)
		case "route":
			return str(&out.Route, 1<<6)
		case "resource":
			return str(&out.Resource, 1<<7)
		case "plan":
			return str(&out.Plan, 1<<8)
		case "priority":
			return str(&out.Priority, 1<<9)
		}
		return false
	})
	if !ok || !d.end() {
		return false
	}
	*req = out
	return true
}

// plainReader reads the plain subset of JSON decodeCheck takes; every method
// reports false at the first byte outside it.
type plainReader struct {
	b []byte
	i int
	s string // b as a string, made at the first str: the strings read are its substrings
}

func (d *plainReader) space() {
	for d.i < len(d.b) {
		switch d.b[d.i] {
		case ' ', '\t', '\n', '\r':
			d.i++
		default:
			return
		}
	}
}

// end: nothing but whitespace is left.
func (d *plainReader) end() bool {
	d.space()
	return d.i == len(d.b)
}

func (d *plainReader) byte(c byte) bool {
	d.space()
	if d.i < len(d.b) && d.b[d.i] == c {
		d.i++
		return true
	}
	return false
}

// object reads {"key": value, …}, member calling read for each key (read
// must consume the value); an empty object is not plain.
func (d *plainReader) object(member func(key []byte) bool) bool {
	if !d.byte('{') {
		return false
	}
	for {
		key, ok := d.raw()
		if !ok || !d.byte(':') || !member(key) {
			return false
		}
		if d.byte('}') {
			return true
		}
		if !d.byte(',') {
			return false
		}
	}
}

// raw reads a string of printable ASCII without escapes and returns its
// bytes (in d.b).
func (d *plainReader) raw() ([]byte, bool) {
	if !d.byte('"') {
		return nil, false
	}
	start := d.i
	for d.i < len(d.b) {
		c := d.b[d.i]
		switch {
		case c == '"':
			d.i++
			return d.b[start : d.i-1], true
		case c < 0x20 || c > 0x7e || c == '\\':
			return nil, false
		}
		d.i++
	}
	return nil, false
}

func (d *plainReader) str() (string, bool) {
	b, ok := d.raw()
	if !ok {
		return "", false
	}
	if d.s == "" {
		d.s = string(d.b)
	}
	end := d.i - 1 // the closing quote
	return d.s[end-len(b) : end], true
}

// int reads an integer of at most 18 digits, no leading zero, no fraction
// or exponent.
func (d *plainReader) int() (int, bool) {
	d.space()
	neg := d.i < len(d.b) && d.b[d.i] == '-'
	if neg {
		d.i++
	}
	start := d.i
	n := 0
	for d.i < len(d.b) && d.b[d.i] >= '0' && d.b[d.i] <= '9' {
		n = n*10 + int(d.b[d.i]-'0')
		d.i++
	}
	digits := d.i - start
	if digits == 0 || digits > 18 || digits > 1 && d.b[start] == '0' {
		return 0, false
	}
	if d.i < len(d.b) {
		switch d.b[d.i] {
		case '.', 'e', 'E':
			return 0, false
		}
	}
	if neg {
		n = -n
	}
	return n, true
}
