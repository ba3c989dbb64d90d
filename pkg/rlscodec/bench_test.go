package rlscodec

import (
	"testing"

	"google.golang.org/grpc/encoding"
	grpcproto "google.golang.org/grpc/encoding/proto"
	"google.golang.org/grpc/mem"
	"google.golang.org/protobuf/proto"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
)

// BenchmarkCodec: a call's request decoded and its answer encoded as the
// grpc-go transport does, by grpc-go's proto codec and by this package's
// (go test -run '^$' -bench Codec -benchmem ./pkg/rlscodec): peerbench's
// request (one descriptor, one entry) and the answer of an envoy
// ratelimit domain; Floodgate's own descriptor shape and its answer (nine
// headers).
func BenchmarkCodec(b *testing.B) {
	for _, bc := range []struct {
		name string
		req  proto.Message
		resp *rlsv3.RateLimitResponse
	}{
		{"envoy_shape", peerbenchRequest(), envoyAnswer()},
		{"floodgate_shape", floodgateRequest(), floodgateAnswer()},
	} {
		in, err := proto.Marshal(bc.req)
		if err != nil {
			b.Fatal(err)
		}
		for _, c := range []struct {
			name  string
			codec encoding.CodecV2
		}{{"grpc-go", encoding.GetCodecV2(grpcproto.Name)}, {"rlscodec", NewCodec()}} {
			b.Run(bc.name+"/"+c.name, func(b *testing.B) {
				b.ReportAllocs()
				for b.Loop() {
					req := new(rlsv3.RateLimitRequest) // as the generated handler makes it
					if err := c.codec.Unmarshal(mem.BufferSlice{mem.SliceBuffer(in)}, req); err != nil {
						b.Fatal(err)
					}
					out, err := c.codec.Marshal(bc.resp)
					if err != nil {
						b.Fatal(err)
					}
					out.Free()
				}
			})
		}
	}
}
