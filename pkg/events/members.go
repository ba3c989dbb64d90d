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
	seen  uint32 // bit i is set once the object's property i was read
	first bool
}

// open reads the '{' that opens the object at path.
func (d *decoder) open(path string) members {
	if d.err == nil {
		if err := d.opening('{', path, "an object"); err != nil {
			d.err = err
		}
	}
	return members{d: d, first: true}
}

// keep makes err, unless nil, the decoder's error. (Only errors are stored:
// a store of nil through o.d would cost a write barrier per member.)
func (o *members) keep(err *ValidationError) {
	if err != nil {
		o.d.err = err
	}
}

// take marks property bit, the member at path, as read; false (and a syntax
// error) when it was read before.
func (o *members) take(bit uint, path string) bool {
	if o.seen&(1<<bit) != 0 {
		o.duplicate(path)
		return false
	}
	o.seen |= 1 << bit
	return true
}

// duplicate reports a second member at path.
func (o *members) duplicate(path string) {
	o.d.err = o.d.syntax(fmt.Sprintf("duplicate member %q", path[strings.LastIndexByte(path, '.')+1:]))
}

// skip reads past the value of a member the schema does not know.
func (o *members) skip() { o.keep(o.d.skip(1)) }

// end reports the first required member missing from the object at path.
func (o *members) end(path string, required []req) {
	if o.d.err == nil {
		o.keep(o.d.required(path, o.seen, required))
	}
}

// endDocument is end for the top-level object: nothing but white space may
// follow it.
func (o *members) endDocument(required []req) {
	if o.d.err == nil {
		o.keep(o.d.end())
	}
	o.end("", required)
}

// The readers below read the member at path, property bit of its object, for
// a generated decoder: each first marks the property read (members.take: a
// second member of that name is a syntax error, and nothing is read), then
// reads the value with the decoder (read.go) and keeps its error there. So a
// generated decoder is one line per member, and what every member does around
// its value is written here once.

// envelope reads the members every event starts with, its CloudEvents
// attributes: "type" (property 0), which must be the decoder's typ, "id" (1)
// and "ts" (2), the member called name, into *id and *ts.
func (o *members) envelope(name []byte, id *string, ts *time.Time) {
	switch string(name) {
	case "type":
		o.constant(0, "type", o.d.typ)
	case "id":
		*id = o.str(1, "id", fmtID, 0)
	case "ts":
		*ts = o.time(2, "ts")
	}
}

// constant reads a member whose value must be want ("type").
func (o *members) constant(bit uint, path, want string) {
	if o.take(bit, path) {
		o.keep(o.d.constant(path, want))
	}
}

// str reads a string of grammar f (max: see format.check).
func (o *members) str(bit uint, path string, f format, max int) string {
	if !o.take(bit, path) {
		return ""
	}
	d := o.d
	s, err := d.str(path)
	if err == nil {
		err = d.valid(path, f.check(s, max))
	}
	return kept(d, s, err)
}

// kept makes err, unless nil, the decoder's error and returns v. (Only
// errors are stored: a store of nil would cost a write barrier per member.)
func kept[T any](d *decoder, v T, err *ValidationError) T {
	if err != nil {
		d.err = err
	}
	return v
}

// valid puts err, the check of the value at path, under path; nil stays nil.
func (d *decoder) valid(path string, err *ValidationError) *ValidationError {
	if err != nil {
		return d.invalid(path, err)
	}
	return nil
}

// enum names an enum of the schemas, for enumValue (generated, common_gen.go).
type enum uint8

// enumAt reads a string of enum e. It returns a constant: decoding an enum
// does not allocate.
func enumAt[E ~string](o *members, bit uint, path string, e enum) E {
	if !o.take(bit, path) {
		return ""
	}
	d := o.d
	b, err := d.strBytes(path)
	if err != nil {
		d.err = err
		return ""
	}
	v, ok := enumValue(e, b)
	if !ok {
		d.err = d.invalid(path, oneOf(string(b), e.values()))
	}
	return E(v)
}

// isEnum reports whether v is a value of enum e.
func isEnum[E ~string](e enum, v E) bool {
	_, ok := enumValue(e, v)
	return ok
}

// checkEnum checks that v is a value of enum e.
func checkEnum[E ~string](e enum, v E) *ValidationError {
	if isEnum(e, v) {
		return nil
	}
	return oneOf(string(v), e.values())
}

// time reads a timestamp.
func (o *members) time(bit uint, path string) time.Time {
	if !o.take(bit, path) {
		return time.Time{}
	}
	t, err := o.d.time(path)
	return kept(o.d, t, err)
}

// int reads an integer within [lo, hi].
func (o *members) int(bit uint, path string, lo, hi int64) int64 {
	if !o.take(bit, path) {
		return 0
	}
	n, err := o.d.integer(path, lo, hi)
	return kept(o.d, n, err)
}

// ip reads an IP address.
func (o *members) ip(bit uint, path string) netip.Addr {
	if !o.take(bit, path) {
		return netip.Addr{}
	}
	a, err := o.d.ip(path)
	return kept(o.d, a, err)
}

// float reads a number >= lo (> lo when excl), and <= hi when hasHi.
func (o *members) float(bit uint, path string, lo float64, excl bool, hi float64, hasHi bool) float64 {
	if !o.take(bit, path) {
		return 0
	}
	d := o.d
	f, err := d.float(path)
	if err == nil && hasHi {
		err = d.valid(path, floatRange(f, lo, excl, hi))
	} else if err == nil {
		err = d.valid(path, floatAtLeast(f, lo, excl))
	}
	return kept(d, f, err)
}

// bool reads true or false.
func (o *members) bool(bit uint, path string) bool {
	if !o.take(bit, path) {
		return false
	}
	v, err := o.d.boolean(path)
	return kept(o.d, v, err)
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
		o.keep(o.d.opening('[', path, "an array"))
	}
	return elements{path: path, max: max, i: -1, first: true}
}

// next advances to the next element; false at the closing ']' and after an
// error.
func (l *elements) next(d *decoder) bool {
	if d.err != nil {
		return false
	}
	ok, err := d.element(&l.first)
	if !ok {
		if err != nil {
			d.err = err
		}
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

// envelope checks the members every event starts with, its CloudEvents
// attributes "id" and "ts" (its "type" is the encoder's constant).
func (c *checker) envelope(id string, ts time.Time) {
	c.at("id", validID(id))
	c.at("ts", validTime(ts))
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

// appendEnvelope appends the opening of an event of type typ and its
// CloudEvents attributes: {"type":typ,"id":id,"ts":ts (ids and timestamps
// need no escaping: their grammars exclude what JSON escapes).
func appendEnvelope(b []byte, typ, id string, ts time.Time) []byte {
	b = append(b, `{"type":"`...)
	b = append(b, typ...)
	b = append(b, `","id":"`...)
	b = append(b, id...)
	b = append(b, `","ts":"`...)
	b = AppendTime(b, ts)
	return append(b, '"')
}

// sep appends the ',' before every element of an array but the first.
func sep(b []byte, i int) []byte {
	if i > 0 {
		return append(b, ',')
	}
	return b
}

// result is what Decode* returns: v, or its zero value and err.
func result[T any](v T, err *ValidationError) (T, error) {
	if err != nil {
		var zero T
		return zero, err
	}
	return v, nil
}

// appendEvent is Append* of an event: it appends v to dst with encode, the
// event's generated encoder, unless err, v's validation, is not nil.
func appendEvent[T any](dst []byte, err error, v *T, encode func(*T, []byte) []byte) ([]byte, error) {
	if err != nil {
		return dst, err
	}
	return encode(v, dst), nil
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
