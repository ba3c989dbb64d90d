package rlscodec

import (
	"bytes"
	"context"
	"net"
	"strings"
	"testing"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	typev3 "github.com/envoyproxy/go-control-plane/envoy/type/v3"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/grpc/health"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/types/known/durationpb"
	"google.golang.org/protobuf/types/known/structpb"
	"google.golang.org/protobuf/types/known/wrapperspb"
)

func entries(kv ...string) []*rlcommon.RateLimitDescriptor_Entry {
	var es []*rlcommon.RateLimitDescriptor_Entry
	for i := 0; i+1 < len(kv); i += 2 {
		es = append(es, &rlcommon.RateLimitDescriptor_Entry{Key: kv[i], Value: kv[i+1]})
	}
	return es
}

// peerbenchRequest is the request peerbench sends: one descriptor, one entry.
func peerbenchRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "peerbench_1796042723271979137",
		Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entries("user", "u01234")}}}
}

// floodgateRequest is a check in Floodgate's descriptor shape.
func floodgateRequest() *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: "edge", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entries(
		"principal_kind", "bot", "principal_id", "bot_abc123", "remote_address", "203.0.113.7",
		"method", "POST", "route", "/channels/{channel_id}/messages")}}}
}

// envoyAnswer is the answer to peerbenchRequest (envoyAnswer in
// pkg/limiter/envoyrls).
func envoyAnswer() *rlsv3.RateLimitResponse {
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code:               rlsv3.RateLimitResponse_OK,
		CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{RequestsPerUnit: 100, Unit: rlsv3.RateLimitResponse_RateLimit_SECOND},
		LimitRemaining:     97,
		DurationUntilReset: durationpb.New(730 * time.Millisecond)}}}
}

// floodgateAnswer is a denial in Floodgate's shape (ShouldRateLimit in
// pkg/limiter/envoyrls): a limit with a multiplier, the 429 contract's
// headers and a problem body longer than 127 bytes.
func floodgateAnswer() *rlsv3.RateLimitResponse {
	h := func(k, v string) *corev3.HeaderValue { return &corev3.HeaderValue{Key: k, Value: v} }
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
		Code: rlsv3.RateLimitResponse_OVER_LIMIT,
		CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "principal:bot-global", RequestsPerUnit: 100,
			Unit: rlsv3.RateLimitResponse_RateLimit_SECOND, UnitMultiplier: wrapperspb.UInt32(5)},
		DurationUntilReset: durationpb.New(4*time.Second + 250*time.Millisecond)}},
		ResponseHeadersToAdd: []*corev3.HeaderValue{h("Content-Type", "application/problem+json"),
			h("RateLimit", `"bot-global";r=0;t=5`), h("RateLimit-Policy", `"bot-global";q=100;w=5`), h("Retry-After", "5"),
			h("X-RateLimit-Limit", "100"), h("X-RateLimit-Remaining", "0"), h("X-RateLimit-Reset", "5"),
			h("X-RateLimit-Scope", "principal"), h("X-Request-Id", "0192f1c2-7a3b-7cde-8f00-123456789abc")},
		RawBody: []byte(`{"type":"https://floodgate.dev/problems/rate-limited","title":"Too Many Requests","status":429,` +
			`"detail":"principal limit bot-global exceeded","correlation_id":"0192f1c2-7a3b-7cde-8f00-123456789abc"}`)}
}

// TestRequestRoundTrip: requests proto.Marshal writes decode to what
// proto.Unmarshal makes of them — every field Envoy sends, unknown fields
// kept, merged sub-messages.
func TestRequestRoundTrip(t *testing.T) {
	withUnknown := floodgateRequest()
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	withUnknown.Descriptors[0].Entries[1].ProtoReflect().SetUnknown(protowire.AppendString(protowire.AppendTag(nil, 5, protowire.BytesType), "x"))
	for _, tc := range []struct {
		name string
		req  *rlsv3.RateLimitRequest
	}{
		{"empty", &rlsv3.RateLimitRequest{}},
		{"peerbench", peerbenchRequest()},
		{"floodgate shape", floodgateRequest()},
		{"every field", &rlsv3.RateLimitRequest{Domain: "d", HitsAddend: 1 << 31, Descriptors: []*rlcommon.RateLimitDescriptor{
			{Entries: entries("a", "1", "b", ""), Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 42,
				Unit: typev3.RateLimitUnit_HOUR, UnitMultiplier: wrapperspb.UInt32(3)}, HitsAddend: wrapperspb.UInt64(1 << 40), IsNegativeHits: true},
			{}, {Entries: entries("", "", "ключ", "значение"), HitsAddend: wrapperspb.UInt64(0), Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{}},
			{Entries: entries("c", strings.Repeat("v", 300))},
		}}},
		{"unknown fields", withUnknown},
	} {
		t.Run(tc.name, func(t *testing.T) {
			b, err := proto.Marshal(tc.req)
			require.NoError(t, err)
			got := &rlsv3.RateLimitRequest{Domain: "stale", HitsAddend: 9} // replaced, not merged
			require.NoError(t, UnmarshalRequest(b, got))
			require.True(t, proto.Equal(tc.req, got), "got %v\nwant %v", got, tc.req)
			for i := range b { // the strings are the decoder's own
				b[i] ^= 0xff
			}
			require.True(t, proto.Equal(tc.req, got))
		})
	}
	t.Run("merged", func(t *testing.T) {
		// A singular message twice merges; a string or scalar twice: the last wins.
		one := &rlcommon.RateLimitDescriptor{Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1}, HitsAddend: wrapperspb.UInt64(3)}
		two := &rlcommon.RateLimitDescriptor{Limit: &rlcommon.RateLimitDescriptor_RateLimitOverride{Unit: typev3.RateLimitUnit_DAY}}
		b1, err := proto.Marshal(one)
		require.NoError(t, err)
		b2, err := proto.Marshal(two)
		require.NoError(t, err)
		d := protowire.AppendBytes(protowire.AppendTag(nil, 2, protowire.BytesType), append(b1, b2...))
		b := append(protowire.AppendString(protowire.AppendTag(nil, 1, protowire.BytesType), "first"), d...)
		b = protowire.AppendString(protowire.AppendTag(b, 1, protowire.BytesType), "second")
		assertSameDecode(t, b)
		var got rlsv3.RateLimitRequest
		require.NoError(t, UnmarshalRequest(b, &got))
		require.Equal(t, "second", got.GetDomain())
		require.Equal(t, uint32(1), got.GetDescriptors()[0].GetLimit().GetRequestsPerUnit())
		require.Equal(t, typev3.RateLimitUnit_DAY, got.GetDescriptors()[0].GetLimit().GetUnit())
	})
}

// assertSameDecode: b decodes as proto.Unmarshal decodes it, or both refuse it.
func assertSameDecode(t testing.TB, b []byte) {
	t.Helper()
	want, got := &rlsv3.RateLimitRequest{}, &rlsv3.RateLimitRequest{}
	werr, gerr := proto.Unmarshal(b, want), UnmarshalRequest(b, got)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("% x: proto.Unmarshal: %v, UnmarshalRequest: %v", b, werr, gerr)
	}
	if werr == nil && !proto.Equal(want, got) {
		t.Fatalf("% x: got %v, want %v", b, got, want)
	}
}

// TestRequestMalformed: what proto.Unmarshal refuses is refused; what it
// accepts (a known field of the wrong wire type is an unknown field) is
// accepted.
func TestRequestMalformed(t *testing.T) {
	good, err := proto.Marshal(floodgateRequest())
	require.NoError(t, err)
	tag := func(num protowire.Number, typ protowire.Type) []byte { return protowire.AppendTag(nil, num, typ) }
	for _, tc := range []struct {
		name   string
		b      []byte
		refuse bool
	}{
		{"truncated", good[:len(good)-1], true},
		{"truncated tag", []byte{0x80}, true},
		{"length past the end", []byte{0x0a, 0x05, 'a'}, true},
		{"field number 0", []byte{0x00, 0x01}, true},
		{"field number past the largest", append(protowire.AppendVarint(nil, uint64(protowire.MaxValidNumber+1)<<3), 0), true},
		{"end group at the top", tag(7, protowire.EndGroupType), true},
		{"reserved wire type", []byte{0x0e}, true},
		{"invalid UTF-8 domain", []byte{0x0a, 0x01, 0xff}, true},
		{"invalid UTF-8 entry value", []byte{0x12, 0x05, 0x0a, 0x03, 0x12, 0x01, 0xc3}, true},
		{"truncated varint", []byte{0x18, 0xff}, true},
		{"overlong varint", append([]byte{0x18}, bytes.Repeat([]byte{0xff}, 10)...), true},
		{"malformed entry", []byte{0x12, 0x03, 0x0a, 0x01, 0x0a}, true},
		{"malformed override", []byte{0x12, 0x03, 0x12, 0x01, 0x08}, true},
		{"malformed hits_addend wrapper", []byte{0x12, 0x03, 0x1a, 0x01, 0x08}, true},
		{"unterminated group", append(tag(9, protowire.StartGroupType), 0x08, 0x01), true},
		{"mismatched group end", append(tag(9, protowire.StartGroupType), tag(8, protowire.EndGroupType)...), true},
		{"domain as a varint", []byte{0x08, 0x05}, false},
		{"descriptors as fixed32", []byte{0x15, 1, 2, 3, 4}, false},
		{"hits_addend as bytes", []byte{0x1a, 0x01, 0xff}, false},
		{"a group", append(append(tag(9, protowire.StartGroupType), 0x08, 0x01), tag(9, protowire.EndGroupType)...), false},
		{"non-minimal tag", []byte{0x8a, 0x00, 0x01, 'a'}, false},
		{"hits_addend past uint32", append([]byte{0x18}, protowire.AppendVarint(nil, 1<<33+5)...), false},
		{"negative unit", append([]byte{0x12, 0x0d, 0x12, 0x0b, 0x10}, protowire.AppendVarint(nil, uint64(1<<64-2))...), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assertSameDecode(t, tc.b)
			err := UnmarshalRequest(tc.b, &rlsv3.RateLimitRequest{})
			require.Equal(t, tc.refuse, err != nil, "err %v", err)
		})
	}
}

// FuzzUnmarshalRequest: any bytes decode as proto.Unmarshal decodes them
// (go test -fuzz FuzzUnmarshalRequest ./pkg/rlscodec).
func FuzzUnmarshalRequest(f *testing.F) {
	for _, m := range []proto.Message{peerbenchRequest(), floodgateRequest(), &rlsv3.RateLimitRequest{HitsAddend: 3, Descriptors: []*rlcommon.RateLimitDescriptor{{
		Limit:      &rlcommon.RateLimitDescriptor_RateLimitOverride{RequestsPerUnit: 1, Unit: 2, UnitMultiplier: wrapperspb.UInt32(4)},
		HitsAddend: wrapperspb.UInt64(5), IsNegativeHits: true}}}} {
		b, err := proto.Marshal(m)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Add([]byte{0x4b, 0x08, 0x01, 0x4c})
	f.Fuzz(func(t *testing.T, b []byte) { assertSameDecode(t, b) })
}

// assertSameEncode: m encodes to the bytes proto.Marshal writes, unknown
// fields left out (to a message it reads back equal when m's dynamic
// metadata, a map, has no one order), or both refuse it.
func assertSameEncode(t testing.TB, m *rlsv3.RateLimitResponse) {
	t.Helper()
	known := m
	if m != nil && !byProto(m) {
		known = discardUnknown(t, m)
	}
	want, werr := proto.Marshal(known)
	got, gerr := AppendResponse([]byte("prefix"), m)
	if (werr == nil) != (gerr == nil) {
		t.Fatalf("%v: proto.Marshal: %v, AppendResponse: %v", m, werr, gerr)
	}
	if werr != nil {
		return
	}
	require.Equal(t, "prefix", string(got[:6]))
	got = got[6:]
	if m.GetDynamicMetadata() == nil && !bytes.Equal(want, got) {
		t.Fatalf("%v: got % x, want % x", m, got, want)
	}
	back := &rlsv3.RateLimitResponse{}
	require.NoError(t, proto.Unmarshal(got, back))
	if m != nil {
		require.True(t, proto.Equal(known, back), "got %v, want %v", back, known)
	}
}

// discardUnknown is m without its unknown fields.
func discardUnknown(t testing.TB, m *rlsv3.RateLimitResponse) *rlsv3.RateLimitResponse {
	t.Helper()
	b, err := proto.MarshalOptions{AllowPartial: true}.Marshal(m)
	if err != nil { // not UTF-8: keep m, which both refuse
		return m
	}
	out := &rlsv3.RateLimitResponse{}
	require.NoError(t, proto.UnmarshalOptions{DiscardUnknown: true}.Unmarshal(b, out))
	return out
}

// byProto reports whether AppendResponse leaves m to proto: a quota or
// dynamic metadata.
func byProto(m *rlsv3.RateLimitResponse) bool {
	if m.GetQuota() != nil || m.GetDynamicMetadata() != nil {
		return true
	}
	for _, st := range m.GetStatuses() {
		if st.GetQuota() != nil {
			return true
		}
	}
	return false
}

// TestResponseEncoding: every field the limiter sets, and the ones it does
// not (quota and dynamic metadata, left to proto), encode as proto.Marshal
// encodes them, unknown fields left out; a string that is not UTF-8 is
// refused as proto refuses it.
func TestResponseEncoding(t *testing.T) {
	withUnknown := floodgateAnswer()
	withUnknown.ProtoReflect().SetUnknown(protowire.AppendVarint(protowire.AppendTag(nil, 99, protowire.VarintType), 7))
	withUnknown.Statuses[0].DurationUntilReset.ProtoReflect().SetUnknown(protowire.AppendFixed32(protowire.AppendTag(nil, 20, protowire.Fixed32Type), 1))
	withUnknown.Statuses[0].ProtoReflect().SetUnknown(protowire.AppendFixed64(protowire.AppendTag(nil, 21, protowire.Fixed64Type), 2))
	withUnknown.Statuses[0].CurrentLimit.UnitMultiplier.ProtoReflect().SetUnknown([]byte{0x10, 0x01})
	withUnknown.ResponseHeadersToAdd[0].ProtoReflect().SetUnknown([]byte{0x20, 0x01})
	withUnknownQuota := proto.CloneOf(withUnknown)
	withUnknownQuota.Quota = &rlsv3.RateLimitResponse_Quota{Requests: 1}
	md, err := structpb.NewStruct(map[string]any{"a": "b"})
	require.NoError(t, err)
	for _, tc := range []struct {
		name   string
		m      *rlsv3.RateLimitResponse
		refuse bool
	}{
		{"nil", nil, false},
		{"empty", &rlsv3.RateLimitResponse{}, false},
		{"envoy shape", envoyAnswer(), false},
		{"floodgate shape", floodgateAnswer(), false},
		{"unknown fields", withUnknown, false},
		{"unknown fields left to proto", withUnknownQuota, false},
		{"cost refusal", &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT, RawBody: []byte("{}"),
			Statuses:             []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: rlsv3.RateLimitResponse_OVER_LIMIT}, {Code: rlsv3.RateLimitResponse_OVER_LIMIT}},
			ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "Content-Type", Value: "application/problem+json"}, {Key: "X-Request-Id", Value: "r"}}}, false},
		{"negative values", &rlsv3.RateLimitResponse{OverallCode: -1, Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: -2,
			CurrentLimit:       &rlsv3.RateLimitResponse_RateLimit{Unit: -3, UnitMultiplier: wrapperspb.UInt32(0)},
			DurationUntilReset: &durationpb.Duration{Seconds: -5, Nanos: -7}}}}, false},
		{"nil elements and empty messages", &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{nil, {CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{},
			DurationUntilReset: &durationpb.Duration{}}}, ResponseHeadersToAdd: []*corev3.HeaderValue{nil, {}}, RequestHeadersToAdd: []*corev3.HeaderValue{{RawValue: []byte{0, 1}}}}, false},
		{"long messages", &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{
			Name: strings.Repeat("n", 200)}}, {CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: strings.Repeat("m", 20000)}}},
			RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "k", Value: strings.Repeat("v", 70000)}}}, false},
		{"quota", &rlsv3.RateLimitResponse{OverallCode: 1, Quota: &rlsv3.RateLimitResponse_Quota{Requests: 3, Id: "q"}}, false},
		{"a status's quota", &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{Code: 1}, {Quota: &rlsv3.RateLimitResponse_Quota{Requests: 3}}}}, false},
		{"dynamic metadata", &rlsv3.RateLimitResponse{OverallCode: 2, DynamicMetadata: md}, false},
		{"invalid UTF-8 header", &rlsv3.RateLimitResponse{ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "k", Value: "\xff"}}}, true},
		{"invalid UTF-8 request header key", &rlsv3.RateLimitResponse{RequestHeadersToAdd: []*corev3.HeaderValue{{Key: "\xc3"}}}, true},
		{"invalid UTF-8 limit name", &rlsv3.RateLimitResponse{Statuses: []*rlsv3.RateLimitResponse_DescriptorStatus{{
			CurrentLimit: &rlsv3.RateLimitResponse_RateLimit{Name: "a\x80"}}}}, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			assertSameEncode(t, tc.m)
			_, err := AppendResponse(nil, tc.m)
			require.Equal(t, tc.refuse, err != nil, "err %v", err)
		})
	}
}

// FuzzAppendResponse: every response proto.Unmarshal makes of any bytes
// encodes as proto.Marshal encodes it, unknown fields left out (go test -fuzz FuzzAppendResponse
// ./pkg/rlscodec).
func FuzzAppendResponse(f *testing.F) {
	for _, m := range []*rlsv3.RateLimitResponse{envoyAnswer(), floodgateAnswer()} {
		b, err := proto.Marshal(m)
		require.NoError(f, err)
		f.Add(b)
	}
	f.Fuzz(func(t *testing.T, b []byte) {
		m := &rlsv3.RateLimitResponse{}
		if proto.Unmarshal(b, m) != nil {
			return
		}
		assertSameEncode(t, m)
	})
}

// TestCodec: the grpc-go codec decodes a request from one buffer or
// several, encodes a response, and leaves other messages to grpc-go's
// codec — on a server given it with grpc.ForceServerCodecV2, health
// answers and a call decodes and answers.
func TestCodec(t *testing.T) {
	c := NewCodec()
	require.Equal(t, "proto", c.Name())
	in, err := proto.Marshal(floodgateRequest())
	require.NoError(t, err)
	for _, data := range []mem.BufferSlice{{mem.SliceBuffer(in)}, {mem.SliceBuffer(in[:3]), mem.SliceBuffer(in[3:10]), mem.SliceBuffer(in[10:])}} {
		got := &rlsv3.RateLimitRequest{}
		require.NoError(t, c.Unmarshal(data, got))
		require.True(t, proto.Equal(floodgateRequest(), got))
	}
	require.Error(t, c.Unmarshal(mem.BufferSlice{mem.SliceBuffer(in[:len(in)-1])}, &rlsv3.RateLimitRequest{}))
	out, err := c.Marshal(floodgateAnswer())
	require.NoError(t, err)
	want, err := proto.Marshal(floodgateAnswer())
	require.NoError(t, err)
	require.Equal(t, want, out.Materialize())
	_, err = c.Marshal(&rlsv3.RateLimitResponse{ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: "\xff"}}})
	require.ErrorIs(t, err, ErrInvalidUTF8)
	_, err = c.Marshal("not a message")
	require.Error(t, err)

	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	g := grpc.NewServer(grpc.ForceServerCodecV2(c))
	rlsv3.RegisterRateLimitServiceServer(g, echo{})
	hs := health.NewServer()
	healthpb.RegisterHealthServer(g, hs)
	go func() { _ = g.Serve(ln) }()
	t.Cleanup(g.Stop)
	cc, err := grpc.NewClient(ln.Addr().String(), grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	t.Cleanup(func() { cc.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	hr, err := healthpb.NewHealthClient(cc).Check(ctx, &healthpb.HealthCheckRequest{})
	require.NoError(t, err)
	require.Equal(t, healthpb.HealthCheckResponse_SERVING, hr.GetStatus())
	r, err := rlsv3.NewRateLimitServiceClient(cc).ShouldRateLimit(ctx, floodgateRequest())
	require.NoError(t, err)
	require.Equal(t, "bot_abc123", r.GetResponseHeadersToAdd()[0].GetValue())
	require.Equal(t, rlsv3.RateLimitResponse_OVER_LIMIT, r.GetOverallCode())
}

// echo answers with the request's second entry as a header.
type echo struct {
	rlsv3.UnimplementedRateLimitServiceServer
}

func (echo) ShouldRateLimit(_ context.Context, in *rlsv3.RateLimitRequest) (*rlsv3.RateLimitResponse, error) {
	e := in.GetDescriptors()[0].GetEntries()[1]
	return &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OVER_LIMIT,
		ResponseHeadersToAdd: []*corev3.HeaderValue{{Key: e.GetKey(), Value: e.GetValue()}}}, nil
}
