package grpcfast

import (
	"bytes"
	"fmt"
	"testing"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	testpb "google.golang.org/grpc/interop/grpc_testing"
)

// BenchmarkCallsResetInTheirRead is what a paced connection's read brings
// under overload: calls that passed their deadline while it waited, each
// followed by its caller's RST_STREAM, then one live call. The server
// parses the reset calls and runs none of them (TestCallResetInItsOwnReadIsNotRun);
// the difference per call between reset=16 and reset=0 is what one costs,
// the client's encoding (a third of it, less) included.
func BenchmarkCallsResetInTheirRead(b *testing.B) {
	for _, n := range []int{0, 16} {
		b.Run(fmt.Sprintf("reset=%d", n), func(b *testing.B) {
			f := serve(b, Config{})
			r := rawDial(b, f.addr)
			_ = r.nc.SetDeadline(time.Time{})
			var wb bytes.Buffer
			w := http2.NewFramer(&wb, nil)
			hs := append(append([]string{}, callHeaders...), "grpc-timeout", "50m", "user-agent", "envoy", "x-request-id", "0")
			hs[5] = testpb.TestService_UnaryCall_FullMethodName
			r.fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
			id := uint32(1)
			call := func() {
				hs[len(hs)-1] = fmt.Sprint(id) // a field that changes, as a request id does
				_ = w.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: r.block(hs...), EndHeaders: true})
				_ = w.WriteData(id, true, []byte{0, 0, 0, 0, 0})
			}
			var credit uint32 // answer bytes read: the connection's window given back
			b.ReportAllocs()
			b.ResetTimer()
			for b.Loop() {
				wb.Reset()
				if credit > 0 {
					_ = w.WriteWindowUpdate(0, credit)
					credit = 0
				}
				for range n {
					call()
					_ = w.WriteRSTStream(id, http2.ErrCodeCancel)
					id += 2
				}
				call()
				live := id
				id += 2
				if _, err := r.nc.Write(wb.Bytes()); err != nil {
					b.Fatal(err)
				}
				for {
					fr, err := r.fr.ReadFrame()
					if err != nil {
						b.Fatal(err)
					}
					if d, ok := fr.(*http2.DataFrame); ok {
						credit += d.Length
					}
					if h, ok := fr.(*http2.MetaHeadersFrame); ok && h.StreamID == live && h.StreamEnded() {
						break
					}
				}
			}
			b.ReportMetric(float64(n), "reset/op")
		})
	}
}
