package events

import (
	"fmt"
	"net/netip"
	"strconv"
	"strings"
	"time"
)

// This file holds what the generated codec (*_gen.go) calls: one reader, one
// check and one writer per kind of member, so that a generated decoder,
// validator or encoder is one line per member.

// format is a string grammar of the schemas (x-floodgate-format) other than
// timestamps and addresses, which have Go types of their own.
type format uint8

const (
	fmtID format = iota
	fmtRoute
	fmtTopic
	fmtResource
	fmtPrincipalID
	fmtText
	fmtMultilineText
	fmtBase64
)

// check validates s against the grammar; max is the length limit of the
// grammars that take one (text, multiline text, base64) and unused otherwise.
func (f format) check(s string, max int) *ValidationError {
	switch f {
	case fmtID:
		return validID(s)
	case fmtRoute:
		return validRoute(s)
	case fmtTopic:
		return validTopic(s)
	case fmtResource:
		return validResource(s)
	case fmtPrincipalID:
		return validPrincipalID(s)
	case fmtText:
		return validText(s, max, false)
	case fmtMultilineText:
		return validText(s, max, true)
	case fmtBase64:
		return validBase64(s, max)
	}
	panic("events: unknown format " + strconv.Itoa(int(f)))
}

// members reads the members of one object for a generated decoder. The
// decoder keeps the first error (decoder.err): after one, every read does
// nothing and returns the zero value, and next reports false, so a generated
// decoder is one line per member with no error plumbing.
type members struct {
	d     *decoder
	name  []byte // the member name next read; aliases the input or d.buf
	seen  uint32 // bit i is set once the object's property i was read
	first bool
}

// open reads the '{' that opens the object at path.
func (d *decoder) open(path string) members {
	if d.err == nil {
		d.err = d.object(path)
	}
	return members{d: d, first: true}
}

// next advances to the next member and reads its name into o.name; false at
// the closing '}' and after an error.
func (o *members) next() bool {
	if o.d.err != nil {
		return false
	}
	var ok bool
	o.name, ok, o.d.err = o.d.member(&o.first)
	return ok
}

// take marks property bit, the member at path, as read; false (and a syntax
// error) when it was read before.
func (o *members) take(bit uint, path string) bool {
	if o.seen&(1<<bit) != 0 {
		o.d.err = o.d.syntax(fmt.Sprintf("duplicate member %q", path[strings.LastIndexByte(path, '.')+1:]))
		return false
	}
	o.seen |= 1 << bit
	return true
}

// skip reads past the value of a member the schema does not know.
func (o *members) skip() { o.d.err = o.d.skip(1) }

// end reports the first required member missing from the object at path.
func (o *members) end(path string, required []req) {
	if o.d.err == nil {
		o.d.err = o.d.required(path, o.seen, required)
	}
}

// endDocument is end for the top-level object: nothing but white space may
// follow it.
func (o *members) endDocument(required []req) {
	if o.d.err == nil {
		o.d.err = o.d.end()
	}
	o.end("", required)
}

// constant reads the "type" member, which must be want.
func (o *members) constant(bit uint, path, want string) {
	if o.take(bit, path) {
		o.d.err = o.d.constant(path, want)
	}
}

// str reads a string of grammar f (max: see format.check).
func (o *members) str(bit uint, path string, f format, max int) (s string) {
	if !o.take(bit, path) {
		return ""
	}
	if s, o.d.err = o.d.str(path); o.d.err == nil {
		if e := f.check(s, max); e != nil {
			o.d.err = o.d.invalid(path, e)
		}
	}
	return s
}

// enum reads a string of an enum: parse (the enum's generated parse function)
// maps it to its constant without allocating; values lists the enum's values
// for the error.
func enum[E ~string](o *members, bit uint, path string, parse func([]byte) (E, bool), values string) (v E) {
	if !o.take(bit, path) {
		return ""
	}
	b, err := o.d.strBytes(path)
	if err != nil {
		o.d.err = err
		return ""
	}
	v, ok := parse(b)
	if !ok {
		o.d.err = o.d.invalid(path, oneOf(string(b), values))
	}
	return v
}

// validEnum checks that v is a value of an enum (see enum).
func validEnum[E ~string](v E, parse func(E) (E, bool), values string) *ValidationError {
	if _, ok := parse(v); ok {
		return nil
	}
	return oneOf(string(v), values)
}

// time reads a timestamp.
func (o *members) time(bit uint, path string) (t time.Time) {
	if o.take(bit, path) {
		t, o.d.err = o.d.time(path)
	}
	return t
}

// integer reads an integer within [lo, hi].
func (o *members) integer(bit uint, path string, lo, hi int64) (n int64) {
	if o.take(bit, path) {
		n, o.d.err = o.d.integer(path, lo, hi)
	}
	return n
}

// ip reads an IP address.
func (o *members) ip(bit uint, path string) (a netip.Addr) {
	if o.take(bit, path) {
		a, o.d.err = o.d.ip(path)
	}
	return a
}

// float reads a number >= lo (> lo when excl).
func (o *members) float(bit uint, path string, lo float64, excl bool) float64 {
	return o.floatCheck(bit, path, lo, excl, 0, false)
}

// floatTo reads a number >= lo (> lo when excl) and <= hi.
func (o *members) floatTo(bit uint, path string, lo float64, excl bool, hi float64) float64 {
	return o.floatCheck(bit, path, lo, excl, hi, true)
}

func (o *members) floatCheck(bit uint, path string, lo float64, excl bool, hi float64, hasHi bool) (f float64) {
	if !o.take(bit, path) {
		return 0
	}
	if f, o.d.err = o.d.float(path); o.d.err != nil {
		return f
	}
	var e *ValidationError
	if hasHi {
		e = floatRange(f, lo, excl, hi)
	} else {
		e = floatAtLeast(f, lo, excl)
	}
	if e != nil {
		o.d.err = o.d.invalid(path, e)
	}
	return f
}

// boolean reads true or false.
func (o *members) boolean(bit uint, path string) (v bool) {
	if o.take(bit, path) {
		v, o.d.err = o.d.boolean(path)
	}
	return v
}

// elements reads the elements of one array member of at most max items for a
// generated decoder. It does not hold the decoder: escape analysis does not
// tell a struct's fields apart, and path, which goes into errors, would take
// the decoder to the heap with it.
type elements struct {
	path  string
	max   int
	i     int
	first bool
}

// list reads the '[' that opens the array of property bit, the member at path.
func (o *members) list(bit uint, path string, max int) elements {
	if o.take(bit, path) {
		o.d.err = o.d.array(path)
	}
	return elements{path: path, max: max, i: -1, first: true}
}

// next advances to the next element; false at the closing ']' and after an
// error.
func (l *elements) next(d *decoder) bool {
	if d.err != nil {
		return false
	}
	var ok bool
	if ok, d.err = d.element(&l.first); !ok {
		return false
	}
	if l.i++; l.i == l.max {
		d.err = d.tooManyItems(l.path, l.max)
		return false
	}
	return true
}

// check puts an error of the element just decoded under its path.
func (l *elements) check(d *decoder) {
	if d.err != nil {
		d.err = within(l.path+"["+strconv.Itoa(l.i)+"]", d.err)
	}
}

// grow appends a zero element to *s and returns it, to be decoded into.
func grow[T any](s *[]T) *T {
	*s = append(*s, *new(T))
	return &(*s)[len(*s)-1]
}

// checker collects the first error of a generated validate method; the
// checks after it still run, but only a valid event is the common case.
type checker struct {
	err *ValidationError
}

// at keeps err, about member field, unless an earlier member failed.
func (c *checker) at(field string, err *ValidationError) {
	if err != nil && c.err == nil {
		c.err = at(field, err)
	}
}

// count checks the length of the array member field against its maxItems.
func (c *checker) count(field string, n, max int) {
	if n > max {
		c.at(field, tooMany(n, max))
	}
}

// item keeps err, about element i of the array member field.
func (c *checker) item(field string, i int, err *ValidationError) {
	if err != nil && c.err == nil {
		c.err = at(field+"["+strconv.Itoa(i)+"]", err)
	}
}

// sep appends the ',' before every element of an array but the first.
func sep(b []byte, i int) []byte {
	if i > 0 {
		return append(b, ',')
	}
	return b
}

// unmarshal is UnmarshalJSON of an event: it decodes data with decode into
// *v, and leaves *v as it was on error.
func unmarshal[T any](v *T, data []byte, decode func([]byte) (T, error)) error {
	ev, err := decode(data)
	if err == nil {
		*v = ev
	}
	return err
}
