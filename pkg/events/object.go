package events

import (
	"encoding/binary"
	"net/netip"
	"time"
	"unsafe"
)

// This file holds the one decoder of every object of the schemas. The
// generator describes each object type once, as a table (object, one prop a
// member, *_gen.go); the loop below reads any object from its table, and
// members.read each member by its kind with the readers of members.go. So
// what every object and member does when it is decoded is written here once,
// and a generated file holds a table for it. (Encoding and validation stay
// generated code, one line or two a member: a loop over the same tables cost
// Append<Event> a third more time; see docs/benchmarks.md.)

// object is the table of one object type of the schemas (x-floodgate-go-type).
type object struct {
	path  string // the error path of the object: "" at the root and in arrays
	event bool   // the root of an event: nothing may follow it
	props []prop // its members, in schema order: member i is property bit i
	need  uint32 // bit i is set when member i is required
	// new allocates one (for an optional member of this type), grow appends
	// one to a slice (for an array member of this type): see newOf, growOf.
	new  func() unsafe.Pointer
	grow func(sliceHeader) (sliceHeader, unsafe.Pointer)
}

// prop is one member of an object: where its Go field is, how it is read and
// what bounds its value.
type prop struct {
	name     string   // the member's name
	path     string   // its error path ("window.start")
	kind     propKind // its Go type and reader
	off      uintptr  // the offset of its Go field in the object's struct
	required bool
	format   format  // pString
	max      int     // pString: the format's length limit; pList: maxItems
	enum     enum    // pEnum
	lo, hi   int64   // pInt64, pInt32
	flo, fhi float64 // pFloat: >= flo (> flo when excl), <= fhi when hasHi
	excl     bool
	hasHi    bool
	obj      *object // pStruct, pStructPtr, pList: the table of the member's object
	word     uint64  // the name as prop.is compares it: initTables sets it
}

// propKind is the Go type of a member and how it is read.
type propKind uint8

const (
	pConst     propKind = iota // the "type" member: the decoder's typ, no Go field
	pString                    // string of a format
	pEnum                      // a string enum type
	pTime                      // time.Time
	pIP                        // netip.Addr
	pBool                      // bool
	pInt64                     // int64
	pInt32                     // int32
	pFloat                     // float64
	pStruct                    // an object of table obj
	pStructPtr                 // an optional object of table obj: a pointer, nil when absent
	pList                      // a slice of objects of table obj
)

// envelope returns the members every event starts with, its CloudEvents
// attributes "type", "id" and "ts", then props: the table of an event's
// members. (The generator gives an event these first members only when its
// struct starts with ID and TS, as eventHead does: hasEnvelope.)
func envelope(props ...prop) []prop {
	return append([]prop{
		{name: "type", path: "type", kind: pConst, required: true},
		{name: "id", path: "id", kind: pString, off: unsafe.Offsetof(eventHead{}.ID), required: true, format: fmtID},
		{name: "ts", path: "ts", kind: pTime, off: unsafe.Offsetof(eventHead{}.TS), required: true},
	}, props...)
}

// eventHead is how the struct of every event with an envelope starts.
type eventHead struct {
	ID string
	TS time.Time
}

// sliceHeader is the layout of a slice, for growOf.
type sliceHeader struct {
	data     unsafe.Pointer
	len, cap int
}

// newOf is object.new of an object of type T.
func newOf[T any]() unsafe.Pointer { return unsafe.Pointer(new(T)) }

// growOf is object.grow of an object of type T: it appends a zero T to the
// slice s and returns the slice and the new element. (The slice goes by
// value, not by pointer: a pointer passed to a function value escapes, and it
// would take the decoded event to the heap with it.)
func growOf[T any](s sliceHeader) (sliceHeader, unsafe.Pointer) {
	e := grow((*[]T)(unsafe.Pointer(&s)))
	return s, unsafe.Pointer(e)
}

// decodeEvent is Decode<Event>: it decodes data, an event of type typ whose
// table is t, and validates it. Every error satisfies errors.Is(err,
// ErrInvalid); the event is zero on error.
func decodeEvent[T any](data []byte, typ string, t *object) (T, error) {
	// The event is a local variable: its members are stored to without going
	// through the heap.
	var v T
	d := &decoder{data: data, typ: typ}
	d.object(t, unsafe.Pointer(&v))
	return result(v, d.err)
}

// object reads the object of table t into the struct at p.
func (d *decoder) object(t *object, p unsafe.Pointer) {
	o := d.open(t.path)
	next := 0 // the member expected next: an encoder writes them in order
	for name, ok := d.member(&o.first); ok; name, ok = d.member(&o.first) {
		i := t.find(name, next)
		if i < 0 {
			o.skip()
			continue
		}
		next = i + 1
		f := &t.props[i]
		o.read(f, uint(i), unsafe.Add(p, f.off))
	}
	if t.event {
		o.endDocument(t)
	} else {
		o.end(t)
	}
}

// find returns the index of the member called name, -1 for none; it looks at
// index hint first.
func (t *object) find(name []byte, hint int) int {
	if hint < len(t.props) && t.props[hint].is(name) {
		return hint
	}
	for i := range t.props {
		if string(name) == t.props[i].name {
			return i
		}
	}
	return -1
}

// is reports whether name is f's name. A name of at most eight bytes with
// eight bytes of input from its start (the colon and the value follow it) is
// compared as one word, with no call.
func (f *prop) is(name []byte) bool {
	if len(name) != len(f.name) {
		return false
	}
	if len(name) > 8 || cap(name) < 8 {
		return string(name) == f.name
	}
	return binary.LittleEndian.Uint64(name[:8])<<(64-8*len(name)) == f.word
}

// nameWord is prop.word of a member called name: its first bytes (at most
// eight) as prop.is reads them.
func nameWord(name string) uint64 {
	var b [8]byte
	n := copy(b[:], name)
	return binary.LittleEndian.Uint64(b[:]) << (64 - 8*n)
}

// read reads member f, property bit of its object, into its Go field at p,
// with the reader of its kind (members.go).
func (o *members) read(f *prop, bit uint, p unsafe.Pointer) {
	switch f.kind {
	case pConst:
		o.constant(bit, f.path, o.d.typ)
	case pString:
		*(*string)(p) = o.str(bit, f.path, f.format, f.max)
	case pEnum:
		*(*string)(p) = enumAt[string](o, bit, f.path, f.enum)
	case pTime:
		*(*time.Time)(p) = o.time(bit, f.path)
	case pIP:
		*(*netip.Addr)(p) = o.ip(bit, f.path)
	case pBool:
		*(*bool)(p) = o.bool(bit, f.path)
	case pInt64:
		*(*int64)(p) = o.int(bit, f.path, f.lo, f.hi)
	case pInt32:
		*(*int32)(p) = int32(o.int(bit, f.path, f.lo, f.hi))
	case pFloat:
		*(*float64)(p) = o.float(bit, f.path, f.flo, f.excl, f.fhi, f.hasHi)
	case pStruct:
		if o.take(bit, f.path) {
			o.d.object(f.obj, p)
		}
	case pStructPtr:
		if o.take(bit, f.path) {
			q := f.obj.new()
			*(*unsafe.Pointer)(p) = q
			o.d.object(f.obj, q)
		}
	case pList:
		d := o.d
		for l := o.list(bit, f.path, f.max); l.next(d); l.check(d) {
			h := (*sliceHeader)(p)
			var e unsafe.Pointer
			*h, e = f.obj.grow(*h)
			d.object(f.obj, e)
		}
	}
}

// initTables completes the tables of every object type (generated,
// common_gen.go): prop.word.
func initTables(tables ...*object) {
	for _, t := range tables {
		for i := range t.props {
			t.props[i].word = nameWord(t.props[i].name)
		}
	}
}
