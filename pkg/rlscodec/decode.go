// Package rlscodec is the protobuf codec of Envoy's rate-limit service on
// both of the limiter's gRPC transports: RateLimitRequest decoded and
// RateLimitResponse encoded by hand with protowire, every other message by
// google.golang.org/protobuf. Its output is proto's own: a request decodes
// to the message proto.Unmarshal makes of the same bytes (unknown fields
// kept, malformed input refused), a response encodes to the bytes
// proto.Marshal writes (but for unknown fields, which a response built by
// the limiter does not have: AppendResponse).
package rlscodec

import (
	"errors"
	"unicode/utf8"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

// Errors of a malformed message, as proto.Unmarshal refuses it.
var (
	ErrInvalidWire = errors.New("rlscodec: cannot parse invalid wire-format data")
	ErrInvalidUTF8 = errors.New("rlscodec: string field contains invalid UTF-8")
)

// UnmarshalRequest replaces m with the request in b, as proto.Unmarshal
// does. Every string of m shares one copy of b, so b may be reused when it
// returns.
func UnmarshalRequest(b []byte, m *rlsv3.RateLimitRequest) error {
	m.Reset()
	nd, err := count(b, 2)
	if err != nil {
		return err
	}
	d := decoder{all: b}
	switch {
	case nd == 1: // the usual: the descriptor and its slot in one allocation
		one := new(oneDescriptor)
		d.ds, m.Descriptors = one.d[:], one.p[:0]
	case nd > 1:
		d.ds = make([]rlcommon.RateLimitDescriptor, nd)
		m.Descriptors = make([]*rlcommon.RateLimitDescriptor, 0, nd)
	}
	return fields(b, m, func(num protowire.Number, typ protowire.Type, rest []byte) (int, bool, error) {
		switch {
		case num == 1 && typ == protowire.BytesType:
			v, n, err := d.str(rest)
			m.Domain = v
			return n, true, err
		case num == 2 && typ == protowire.BytesType:
			v, n, err := message(rest)
			if err != nil {
				return 0, true, err
			}
			ds := &d.ds[len(m.Descriptors)]
			m.Descriptors = append(m.Descriptors, ds)
			return n, true, d.descriptor(v, ds)
		case num == 3 && typ == protowire.VarintType:
			v, n, err := varint(rest)
			m.HitsAddend = uint32(v)
			return n, true, err
		}
		return 0, false, nil
	})
}

// decoder holds what a request's messages are carved from: its strings
// from one copy of the body, its descriptors from one array.
type decoder struct {
	all  []byte
	copy string
	ds   []rlcommon.RateLimitDescriptor
}

// oneDescriptor and oneEntry are a message and the one-element slice of
// pointers that holds it, allocated together.
type (
	oneDescriptor struct {
		d [1]rlcommon.RateLimitDescriptor
		p [1]*rlcommon.RateLimitDescriptor
	}
	oneEntry struct {
		e [1]rlcommon.RateLimitDescriptor_Entry
		p [1]*rlcommon.RateLimitDescriptor_Entry
	}
)

// str consumes a length-delimited string field's value at b, a part of
// d.all.
func (d *decoder) str(b []byte) (string, int, error) {
	v, n := consumeBytes(b)
	if n < 0 {
		return "", 0, ErrInvalidWire
	}
	if !utf8.Valid(v) {
		return "", 0, ErrInvalidUTF8
	}
	if len(v) == 0 {
		return "", n, nil
	}
	if d.copy == "" {
		d.copy = string(d.all)
	}
	at := cap(d.all) - cap(v) // v is d.all[at:at+len(v)]
	return d.copy[at : at+len(v)], n, nil
}

// consumeBytes is protowire.ConsumeBytes, with the value a slice of b that
// keeps b's capacity (how str finds where it is in the body).
func consumeBytes(b []byte) ([]byte, int) {
	m, n := protowire.ConsumeVarint(b)
	if n < 0 || m > uint64(len(b)-n) {
		return nil, -1
	}
	return b[n : n+int(m)], n + int(m)
}

func (d *decoder) descriptor(b []byte, m *rlcommon.RateLimitDescriptor) error {
	ne, err := count(b, 1)
	if err != nil {
		return err
	}
	var es []rlcommon.RateLimitDescriptor_Entry
	switch {
	case ne == 1:
		one := new(oneEntry)
		es, m.Entries = one.e[:], one.p[:0]
	case ne > 1:
		es = make([]rlcommon.RateLimitDescriptor_Entry, ne)
		m.Entries = make([]*rlcommon.RateLimitDescriptor_Entry, 0, ne)
	}
	return fields(b, m, func(num protowire.Number, typ protowire.Type, rest []byte) (int, bool, error) {
		if num == 4 && typ == protowire.VarintType {
			v, n, err := varint(rest)
			m.IsNegativeHits = protowire.DecodeBool(v)
			return n, true, err
		}
		if num > 3 || typ != protowire.BytesType {
			return 0, false, nil
		}
		v, n, err := message(rest)
		if err != nil {
			return 0, true, err
		}
		switch num {
		case 1:
			e := &es[len(m.Entries)]
			m.Entries = append(m.Entries, e)
			err = d.entry(v, e)
		case 2:
			if m.Limit == nil {
				m.Limit = &rlcommon.RateLimitDescriptor_RateLimitOverride{}
			}
			err = override(v, m.Limit)
		case 3:
			if m.HitsAddend == nil {
				m.HitsAddend = &wrapperspb.UInt64Value{}
			}
			err = uint64Value(v, m.HitsAddend)
		}
		return n, true, err
	})
}

func (d *decoder) entry(b []byte, m *rlcommon.RateLimitDescriptor_Entry) error {
	return fields(b, m, func(num protowire.Number, typ protowire.Type, rest []byte) (int, bool, error) {
		if (num != 1 && num != 2) || typ != protowire.BytesType {
			return 0, false, nil
		}
		v, n, err := d.str(rest)
		if num == 1 {
			m.Key = v
		} else {
			m.Value = v
		}
		return n, true, err
	})
}

func override(b []byte, m *rlcommon.RateLimitDescriptor_RateLimitOverride) error {
	return fields(b, m, func(num protowire.Number, typ protowire.Type, rest []byte) (int, bool, error) {
		switch {
		case num == 1 && typ == protowire.VarintType:
			v, n, err := varint(rest)
			m.RequestsPerUnit = uint32(v)
			return n, true, err
		case num == 2 && typ == protowire.VarintType:
			v, n, err := varint(rest)
			m.Unit = typev3.RateLimitUnit(int32(v))
			return n, true, err
		case num == 3 && typ == protowire.BytesType:
			v, n, err := message(rest)
			if err != nil {
				return 0, true, err
			}
			if m.UnitMultiplier == nil {
				m.UnitMultiplier = &wrapperspb.UInt32Value{}
			}
			return n, true, uint32Value(v, m.UnitMultiplier)
		}
		return 0, false, nil
	})
}

func uint64Value(b []byte, m *wrapperspb.UInt64Value) error {
	return fields(b, m, func(num protowire.Number, typ protowire.Type, rest []byte) (int, bool, error) {
		if num != 1 || typ != protowire.VarintType {
			return 0, false, nil
		}
		v, n, err := varint(rest)
		m.Value = v
		return n, true, err
	})
}

func uint32Value(b []byte, m *wrapperspb.UInt32Value) error {
	return fields(b, m, func(num protowire.Number, typ protowire.Type, rest []byte) (int, bool, error) {
		if num != 1 || typ != protowire.VarintType {
			return 0, false, nil
		}
		v, n, err := varint(rest)
		m.Value = uint32(v)
		return n, true, err
	})
}

// fields walks the fields of message b: field decodes the ones m knows
// (how much of rest the value took, or known false for one it does not
// know) and every other is kept as m's unknown fields, as proto keeps
// them.
func fields(b []byte, m proto.Message, field func(num protowire.Number, typ protowire.Type, rest []byte) (n int, known bool, err error)) error {
	var unknown []byte
	for rest := b; len(rest) > 0; {
		num, typ, n, err := tag(rest)
		if err != nil {
			return err
		}
		rest = rest[n:]
		n, known, err := field(num, typ, rest)
		if err == nil && !known {
			unknown, n, err = skip(unknown, num, typ, rest)
		}
		if err != nil {
			return err
		}
		rest = rest[n:]
	}
	keepUnknown(m, unknown)
	return nil
}

// varint consumes a varint field's value.
func varint(b []byte) (uint64, int, error) {
	v, n := protowire.ConsumeVarint(b)
	if n < 0 {
		return 0, 0, ErrInvalidWire
	}
	return v, n, nil
}

// message consumes a length-delimited field's value.
func message(b []byte) ([]byte, int, error) {
	v, n := consumeBytes(b)
	if n < 0 {
		return nil, 0, ErrInvalidWire
	}
	return v, n, nil
}

// tag consumes a field's tag as proto does: a field number in
// 1..protowire.MaxValidNumber, and an end-group tag only where a group
// ends (never in these messages' own fields).
func tag(b []byte) (protowire.Number, protowire.Type, int, error) {
	var v uint64
	var n int
	if b[0] < 0x80 {
		v, n = uint64(b[0]), 1
	} else if v, n = protowire.ConsumeVarint(b); n < 0 {
		return 0, 0, 0, ErrInvalidWire
	}
	num, typ := v>>3, protowire.Type(v&7)
	if num < uint64(protowire.MinValidNumber) || num > uint64(protowire.MaxValidNumber) || typ == protowire.EndGroupType {
		return 0, 0, 0, ErrInvalidWire
	}
	return protowire.Number(num), typ, n, nil
}

// skip consumes an unknown field's value at b and appends the field to
// unknown, as proto keeps it (the tag in its shortest form).
func skip(unknown []byte, num protowire.Number, typ protowire.Type, b []byte) ([]byte, int, error) {
	n := protowire.ConsumeFieldValue(num, typ, b)
	if n < 0 {
		return unknown, 0, ErrInvalidWire
	}
	unknown = protowire.AppendTag(unknown, num, typ)
	return append(unknown, b[:n]...), n, nil
}

// keepUnknown adds unknown fields to m's, as proto.Unmarshal keeps them.
func keepUnknown(m proto.Message, unknown []byte) {
	if len(unknown) == 0 {
		return
	}
	r := m.ProtoReflect()
	r.SetUnknown(append(r.GetUnknown(), unknown...))
}

// count is how many length-delimited fields num the message b holds; an
// error if its tags and lengths do not parse.
func count(b []byte, num protowire.Number) (int, error) {
	c := 0
	for len(b) > 0 {
		fn, typ, n, err := tag(b)
		if err != nil {
			return 0, err
		}
		b = b[n:]
		if n = protowire.ConsumeFieldValue(fn, typ, b); n < 0 {
			return 0, ErrInvalidWire
		}
		if fn == num && typ == protowire.BytesType {
			c++
		}
		b = b[n:]
	}
	return c, nil
}
