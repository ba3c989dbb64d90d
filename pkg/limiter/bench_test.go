package limiter

import (
	"context"
	"fmt"
	"net/netip"
	"os"
	"sync"
	"sync/atomic"
	"testing"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

// BenchmarkEngineCheck measures in-process decisions per second against the
// local Redis (go test -bench EngineCheck -benchtime 5s ./pkg/limiter),
// with each check its own Redis call (batch=1) and with concurrent checks sharing pipelines.
// Each parallel worker is its own principal, as under real traffic.
func BenchmarkEngineCheck(b *testing.B) {
	rdb := redistest.Client(b)
	data, err := os.ReadFile(shippedRules)
	if err != nil {
		b.Fatal(err)
	}
	grid := string(data)
	benchEngine(b, rdb, []engineBench{
		{"one-tier", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000000000, period: 1s}\n", events.PrincipalBot,
			Request{Method: "GET", Route: "/x", Cost: 1}, false, 0, false},
		{"discord-grid-bot-message", grid, events.PrincipalBot, // principal + resource + daily quota, one script
			Request{Method: "POST", Route: "/channels/{channel_id}/messages", Resource: "channel:1", Cost: 1}, false, 0, false},
		{"discord-grid-anonymous", grid, events.PrincipalAnonymous, // principal script + IP script, pipelined
			Request{Method: "GET", Route: "/x", Cost: 1}, false, 0, false},
		{"over-limit-cache-hit", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1, period: 1h}\n", events.PrincipalBot,
			Request{Method: "GET", Route: "/x", Cost: 1}, true, 0, false},
		// 50 checks per principal under a 100/s limit, exact and leasing 10 units at a time.
		{"user-100-per-s", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 100, period: 1s}\n", events.PrincipalBot,
			Request{Method: "GET", Route: "/x", Cost: 1}, false, 50, false},
		{"user-100-per-s-lease-10", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 100, lease: 10, period: 1s}\n", events.PrincipalBot,
			Request{Method: "GET", Route: "/x", Cost: 1}, false, 50, false},
	})
}

// engineBench is a case of the engine benchmarks: checks of rules, each
// worker its own principal of kind and IP, a new one every per checks
// (0: 4) unless cached (the same over-limit principal: the cache answers).
type engineBench struct {
	name   string
	rules  string
	kind   events.PrincipalKind
	req    Request
	cached bool
	per    int
	// candidate judges every check twice: the same rules are a candidate in
	// shadow (version 2), checked concurrently on its own buckets.
	candidate bool
}

// benchEngine runs each case with every check its own Redis call (batch=1)
// and with concurrent checks sharing pipelines (batch=64), reporting
// checks/s and the share denied and cached, or, with a candidate, judged.
func benchEngine(b *testing.B, rdb redis.UniversalClient, cases []engineBench) {
	for _, tc := range cases {
		for _, batch := range []int{1, 64} {
			b.Run(fmt.Sprintf("%s/batch=%d", tc.name, batch), func(b *testing.B) {
				e := newTestEngine(b, rdb, tc.rules, func(c *EngineConfig) { c.OverLimitEntries, c.RedisBatch = 100_000, batch })
				if err := e.Load(context.Background()); err != nil {
					b.Fatal(err)
				}
				if tc.candidate {
					cand, err := ParseRules("candidate", []byte(tc.rules))
					if err != nil {
						b.Fatal(err)
					}
					e.rules.(*RuleStore).SetCandidate(&Candidate{Version: 2, Rules: cand, Impact: &benchImpact{}})
				}
				base := redistest.Unique(b, "bench")
				var worker, denied, cached, judged atomic.Int64
				b.SetParallelism(16) // 32 checks in flight on 2 cores, as under a busy gateway
				b.ResetTimer()
				b.RunParallel(func(pb *testing.PB) {
					w := worker.Add(1)
					req := tc.req
					req.Principal = events.Principal{Kind: tc.kind, ID: fmt.Sprintf("%s_%d", base, w)}
					req.IP = netip.AddrFrom4([4]byte{10, byte(w >> 8), byte(w), 1})
					ctx := context.Background()
					for i := 0; pb.Next(); i++ {
						if per := max(tc.per, 4); !tc.cached && i%per == 0 { // a new principal and IP every few checks: buckets never run dry
							req.Principal.ID = fmt.Sprintf("%s_%d_%d", base, w, i)
							req.IP = netip.AddrFrom4([4]byte{10, byte(w), byte(i >> 10), byte(i >> 2)})
						}
						r, err := e.Check(ctx, req)
						if err != nil || r.Degraded {
							b.Errorf("check: %v %s", err, r.Error)
							return
						}
						if !r.Allowed {
							denied.Add(1)
						}
						if r.Cached {
							cached.Add(1)
						}
						if r.CandidateVersion == 2 {
							judged.Add(1)
						}
					}
				})
				b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "checks/s")
				if tc.candidate {
					b.ReportMetric(100*float64(judged.Load())/float64(b.N), "%judged")
					return
				}
				b.ReportMetric(100*float64(denied.Load())/float64(b.N), "%denied")
				b.ReportMetric(100*float64(cached.Load())/float64(b.N), "%cached")
			})
		}
	}
}

// benchImpact counts like the rollout's impact counts do: two atomic adds,
// and a paired count by class under a read lock (pkg/limiter/candidate).
type benchImpact struct {
	total, blocked, errors atomic.Int64
	mu                     sync.RWMutex
	classes                map[benchClass]*atomic.Int64
}

type benchClass struct{ prio, kind, plan, route string }

func (c *benchImpact) AddPaired(p admission.Priority, req Request, plan string, cand, _, _ bool) {
	k := benchClass{p.String(), string(req.Principal.Kind), plan, req.Route}
	c.mu.RLock()
	n := c.classes[k]
	c.mu.RUnlock()
	if n == nil {
		c.mu.Lock()
		if c.classes == nil {
			c.classes = map[benchClass]*atomic.Int64{}
		}
		if n = c.classes[k]; n == nil {
			n = &atomic.Int64{}
			c.classes[k] = n
		}
		c.mu.Unlock()
	}
	if cand {
		n.Add(1)
	}
}

func (c *benchImpact) Add(_ admission.Priority, blocked bool) {
	c.total.Add(1)
	if blocked {
		c.blocked.Add(1)
	}
}

func (c *benchImpact) AddError() { c.errors.Add(1) }
