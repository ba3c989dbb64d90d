package score

import (
	"fmt"
	"net/netip"
	"runtime"
	"testing"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// BenchmarkDecodeAndScore is the detector's hot path for one partition:
// decode a decision.v1 event and score it. 100k principals over 20 routes,
// each with its own IP. Run with -cpu 1 for events/s per core.
func BenchmarkDecodeAndScore(b *testing.B) {
	const principals = 100_000
	msgs := make([][]byte, 1<<16)
	for i := range msgs {
		p := i % principals
		d := dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("user_%07d", p)},
			t0.Add(time.Duration(i)*time.Millisecond), fmt.Sprintf("10.%d.%d.%d", p>>16, (p>>8)&255, p&255),
			fmt.Sprintf("/r%d/{id}", p%20))
		d.ID = fmt.Sprintf("ev_%d", i)
		var err error
		if msgs[i], err = events.EncodeDecision(d); err != nil {
			b.Fatal(err)
		}
	}
	s := newScorer(nil)
	var out []Detection
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		d, err := events.DecodeDecision(msgs[i&(len(msgs)-1)])
		if err != nil {
			b.Fatal(err)
		}
		// Event time moves on with the loop, as a live stream's does.
		d.TS = t0.Add(time.Duration(i) * 20 * time.Microsecond)
		out = s.Observe(&d, out[:0])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkScoreOnly is Observe alone on pre-decoded events.
func BenchmarkScoreOnly(b *testing.B) {
	const principals = 100_000
	ds := make([]events.Decision, 1<<16)
	for i := range ds {
		p := i % principals
		ds[i] = *dec(events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("user_%07d", p)},
			t0, fmt.Sprintf("10.%d.%d.%d", p>>16, (p>>8)&255, p&255), fmt.Sprintf("/r%d/{id}", p%20))
	}
	s := newScorer(nil)
	var out []Detection
	b.ReportAllocs()
	b.ResetTimer()
	for i := 0; b.Loop(); i++ {
		d := &ds[i&(len(ds)-1)]
		d.TS = t0.Add(time.Duration(i) * 20 * time.Microsecond)
		out = s.Observe(d, out[:0])
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// BenchmarkMemoryPerPrincipal holds 1M active principals (each on routes
// routes, from its own IP, so the shared IP store holds 1M IPs too) and
// reports the live heap per principal after a GC.
func BenchmarkMemoryPerPrincipal(b *testing.B) {
	for _, routes := range []int{1, 3} {
		b.Run(fmt.Sprintf("routes=%d", routes), func(b *testing.B) {
			for b.Loop() {
				const n = 1_000_000
				d := dec(events.Principal{Kind: events.PrincipalUser}, t0, "10.0.0.1", "/a")
				routeNames := []string{"/a", "/b/{id}", "/c/{id}/d"}
				ids := make([]string, n)
				for i := range ids {
					ids[i] = fmt.Sprintf("user_%07d", i)
				}
				runtime.GC()
				var before, after runtime.MemStats
				runtime.ReadMemStats(&before)
				s := newScorer(nil)
				for i := 0; i < n; i++ {
					d.Principal.ID = ids[i]
					d.IP = netip.AddrFrom4([4]byte{10, byte(i >> 16), byte(i >> 8), byte(i)})
					for r := 0; r < routes; r++ {
						d.Route = routeNames[r]
						d.TS = t0.Add(time.Duration(i) * time.Microsecond) // all inside one window
						s.Observe(d, nil)
					}
				}
				runtime.GC()
				runtime.ReadMemStats(&after)
				st := s.Stats()
				if st.Principals != n {
					b.Fatalf("holding %d principals, want %d", st.Principals, n)
				}
				b.ReportMetric(float64(after.HeapAlloc-before.HeapAlloc)/n, "bytes/principal")
				b.ReportMetric(float64(s.ips.Len()), "ips")
				runtime.KeepAlive(s)
			}
		})
	}
}
