package rlscodec

import (
	"fmt"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/protoadapt"
)

// Bytes is the codec on a message's bytes (pkg/grpcfast's Codec).
type Bytes struct{}

// Unmarshal decodes b into m: a *rlsv3.RateLimitRequest by hand, any
// other proto message by proto.Unmarshal.
func (Bytes) Unmarshal(b []byte, m any) error {
	if r, ok := m.(*rlsv3.RateLimitRequest); ok {
		return UnmarshalRequest(b, r)
	}
	pm := messageOf(m)
	if pm == nil {
		return fmt.Errorf("rlscodec: %T is not a proto message", m)
	}
	return proto.Unmarshal(b, pm)
}

// MarshalAppend appends m's encoding to b: a *rlsv3.RateLimitResponse by
// hand, any other proto message by proto.
func (Bytes) MarshalAppend(b []byte, m any) ([]byte, error) {
	if r, ok := m.(*rlsv3.RateLimitResponse); ok {
		return AppendResponse(b, r)
	}
	pm := messageOf(m)
	if pm == nil {
		return b, fmt.Errorf("rlscodec: %T is not a proto message", m)
	}
	return proto.MarshalOptions{}.MarshalAppend(b, pm)
}

func messageOf(m any) proto.Message {
	switch v := m.(type) {
	case protoadapt.MessageV2:
		return v
	case protoadapt.MessageV1:
		return protoadapt.MessageV2Of(v)
	}
	return nil
}

// Codec is grpc-go's proto codec with the rate-limit messages' own path:
// a server given it by grpc.ForceServerCodecV2 decodes requests and
// encodes responses with this package, and leaves every other message
// (health, reflection) to grpc-go's codec.
type Codec struct{ std encoding.CodecV2 }

var _ encoding.CodecV2 = Codec{}

// NewCodec returns the codec, with grpc-go's registered proto codec for
// every other message.
func NewCodec() Codec { return Codec{std: encoding.GetCodecV2(grpcproto.Name)} }

// Name is the content-subtype of the codec, proto's.
func (Codec) Name() string { return grpcproto.Name }

// Marshal encodes v.
func (c Codec) Marshal(v any) (mem.BufferSlice, error) {
	r, ok := v.(*rlsv3.RateLimitResponse)
	if !ok {
		return c.std.Marshal(v)
	}
	b, err := AppendResponse(make([]byte, 0, sizeHint(r)), r)
	if err != nil {
		return nil, err
	}
	// As grpc-go's codec does with a small message: its own slice, not a
	// pooled buffer.
	return mem.BufferSlice{mem.SliceBuffer(b)}, nil
}

// Unmarshal decodes data into v.
func (c Codec) Unmarshal(data mem.BufferSlice, v any) error {
	r, ok := v.(*rlsv3.RateLimitRequest)
	if !ok {
		return c.std.Unmarshal(data, v)
	}
	if len(data) == 1 { // the usual: one buffer, read in place
		return UnmarshalRequest(data[0].ReadOnlyData(), r)
	}
	buf := data.MaterializeToBuffer(mem.DefaultBufferPool())
	defer buf.Free()
	return UnmarshalRequest(buf.ReadOnlyData(), r)
}

// sizeHint is about the size of r's encoding, so that it is mostly
// written without growing its buffer.
func sizeHint(r *rlsv3.RateLimitResponse) int {
	n := 16 + len(r.RawBody) + 64*len(r.Statuses)
	for _, h := range r.ResponseHeadersToAdd {
		n += 8 + len(h.GetKey()) + len(h.GetValue()) + len(h.GetRawValue())
	}
	for _, h := range r.RequestHeadersToAdd {
		n += 8 + len(h.GetKey()) + len(h.GetValue()) + len(h.GetRawValue())
	}
	return n
}
