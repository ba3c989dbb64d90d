package rlscodec

import (
	"unicode/utf8"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
)

// AppendResponse appends m's encoding to b: the bytes proto.Marshal
// writes, but for unknown fields, which it leaves out: a response has
// them only when it was decoded from bytes that had them or was given
// them with SetUnknown, and looking for them (protoreflect) costs more
// than the rest of the encoding. A response with a quota or
// dynamic metadata (the limiter sets neither) is encoded by proto itself.
func AppendResponse(b []byte, m *rlsv3.RateLimitResponse) ([]byte, error) {
	if m == nil {
		return b, nil
	}
	if m.Quota != nil || m.DynamicMetadata != nil {
		return proto.MarshalOptions{}.MarshalAppend(b, m)
	}
	for _, st := range m.Statuses {
		if st.GetQuota() != nil {
			return proto.MarshalOptions{}.MarshalAppend(b, m)
		}
	}
	b = appendEnum(b, 1, int32(m.OverallCode))
	var err error
	for _, st := range m.Statuses {
		var at int
		b, at = beginMessage(b, 2)
		if b, err = appendStatus(b, st); err != nil {
			return b, err
		}
		b = endMessage(b, at)
	}
	if b, err = appendHeaders(b, 3, m.ResponseHeadersToAdd); err != nil {
		return b, err
	}
	if b, err = appendHeaders(b, 4, m.RequestHeadersToAdd); err != nil {
		return b, err
	}
	b = appendBytes(b, 5, m.RawBody)
	return b, nil
}

func appendStatus(b []byte, m *rlsv3.RateLimitResponse_DescriptorStatus) ([]byte, error) {
	if m == nil {
		return b, nil
	}
	b = appendEnum(b, 1, int32(m.Code))
	if l := m.CurrentLimit; l != nil {
		var at int
		b, at = beginMessage(b, 2)
		var err error
		if b, err = appendLimit(b, l); err != nil {
			return b, err
		}
		b = endMessage(b, at)
	}
	b = appendVarint(b, 3, uint64(m.LimitRemaining))
	if d := m.DurationUntilReset; d != nil {
		var at int
		b, at = beginMessage(b, 4)
		b = endMessage(appendDuration(b, d), at)
	}
	return b, nil
}

func appendLimit(b []byte, m *rlsv3.RateLimitResponse_RateLimit) ([]byte, error) {
	b = appendVarint(b, 1, uint64(m.RequestsPerUnit))
	b = appendEnum(b, 2, int32(m.Unit))
	var err error
	if b, err = appendString(b, 3, m.Name); err != nil {
		return b, err
	}
	if u := m.UnitMultiplier; u != nil {
		var at int
		b, at = beginMessage(b, 4)
		b = endMessage(appendVarint(b, 1, uint64(u.Value)), at)
	}
	return b, nil
}

func appendDuration(b []byte, m *durationpb.Duration) []byte {
	b = appendVarint(b, 1, uint64(m.Seconds))
	return appendVarint(b, 2, uint64(int64(m.Nanos)))
}

func appendHeaders(b []byte, num protowire.Number, hs []*corev3.HeaderValue) ([]byte, error) {
	var err error
	for _, h := range hs {
		var at int
		b, at = beginMessage(b, num)
		if h != nil {
			if b, err = appendString(b, 1, h.Key); err != nil {
				return b, err
			}
			if b, err = appendString(b, 2, h.Value); err != nil {
				return b, err
			}
			b = appendBytes(b, 3, h.RawValue)
		}
		b = endMessage(b, at)
	}
	return b, nil
}

// beginMessage appends the tag of message field num and one byte for its
// length, and returns where that byte is: endMessage writes the length
// there once the message is appended.
func beginMessage(b []byte, num protowire.Number) ([]byte, int) {
	b = protowire.AppendTag(b, num, protowire.BytesType)
	return append(b, 0), len(b)
}

// endMessage writes the length of the message after b[at] (reserved, one
// byte) there, moving the message when its length takes more bytes.
func endMessage(b []byte, at int) []byte {
	n := len(b) - at - 1
	if n < 0x80 {
		b[at] = byte(n)
		return b
	}
	k := protowire.SizeVarint(uint64(n))
	b = append(b, make([]byte, k-1)...)
	copy(b[at+k:], b[at+1:at+1+n])
	protowire.AppendVarint(b[at:at], uint64(n)) // in place: b[at:at+k]
	return b
}

// appendVarint appends a proto3 scalar field (absent when zero).
func appendVarint(b []byte, num protowire.Number, v uint64) []byte {
	if v == 0 {
		return b
	}
	return protowire.AppendVarint(protowire.AppendTag(b, num, protowire.VarintType), v)
}

// appendEnum appends a proto3 enum field (negative values as proto writes
// them: ten bytes, sign-extended).
func appendEnum(b []byte, num protowire.Number, v int32) []byte {
	return appendVarint(b, num, uint64(int64(v)))
}

func appendBytes(b []byte, num protowire.Number, v []byte) []byte {
	if len(v) == 0 {
		return b
	}
	return protowire.AppendBytes(protowire.AppendTag(b, num, protowire.BytesType), v)
}

// appendString appends a proto3 string field, refused as proto refuses it
// when it is not UTF-8.
func appendString(b []byte, num protowire.Number, v string) ([]byte, error) {
	if len(v) == 0 {
		return b, nil
	}
	if !utf8.ValidString(v) {
		return b, ErrInvalidUTF8
	}
	return protowire.AppendString(protowire.AppendTag(b, num, protowire.BytesType), v), nil
}
