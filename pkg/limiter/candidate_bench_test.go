package limiter

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync/atomic"
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// BenchmarkEngineCheckCandidate is BenchmarkEngineCheck's one-tier and
// discord-grid-bot-message cases with a candidate in shadow (the same rules
// as version 2): every check is judged twice, the candidate concurrently on
// its own buckets. Compare with BenchmarkEngineCheck for what a rollout in
// shadow costs (go test -run '^$' -bench 'EngineCheck' -benchtime 2s ./pkg/limiter).
func BenchmarkEngineCheckCandidate(b *testing.B) {
	rdb := redistest.Client(b)
	data, err := os.ReadFile(shippedRules)
	if err != nil {
		b.Fatal(err)
	}
	cases := []struct {
		name, rules string
		req         Request
	}{
		{"one-tier", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000000000, period: 1s}\n", Request{Method: "GET", Route: "/x", Cost: 1}},
		{"discord-grid-bot-message", string(data), Request{Method: "POST", Route: "/channels/{channel_id}/messages", Resource: "channel:1", Cost: 1}},
	}
	for _, tc := range cases {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/batch=%d", tc.name, batch), func(b *testing.B) {
				e := newTestEngine(b, rdb, tc.rules, func(c *EngineConfig) { c.OverLimitEntries, c.RedisBatch = 100_000, batch })
				if err := e.Load(context.Background()); err != nil {
					b.Fatal(err)
				}
				cand, err := ParseRules("candidate", []byte(tc.rules))
				if err != nil {
					b.Fatal(err)
				}
				e.rules.(*RuleStore).SetCandidate(&Candidate{Version: 2, Rules: cand, impact: &impactCounts{}})
				base := redistest.Unique(b, "bench_cand")
				var worker, judged atomic.Int64
				b.SetParallelism(16)
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					w := worker.Add(1)
					req := tc.req
					req.Principal = events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("%s_%d", base, w)}
					ctx := context.Background()
					for i := 0; pb.Next(); i++ {
						if i%4 == 0 {
							req.Principal.ID = fmt.Sprintf("%s_%d_%d", base, w, i)
							req.IP = netip.AddrFrom4([4]byte{10, byte(w), byte(i >> 10), byte(i >> 2)})
						}
						r, err := e.Check(ctx, req)
						if err != nil || r.Degraded {
							b.Errorf("check: %v %s", err, r.Error)
							return
						}
						if r.CandidateVersion == 2 {
							judged.Add(1)
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
				b.ReportMetric(100*float64(judged.Load())/float64(b.N), "%judged")
			})
		}
	}
}
