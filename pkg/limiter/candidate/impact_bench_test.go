package candidate

import (
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
)

// BenchmarkImpactCounts is what a rules version in shadow adds to each
// check (pkg/limiter/check.go): Add and AddPaired on the version's counts,
// from every core at once, with a flusher tracking them. Nothing may be
// allocated once a class is counted (go test -run '^$' -bench . -benchmem
// ./pkg/limiter/candidate).
func BenchmarkImpactCounts(b *testing.B) {
	f := NewImpactFlusher(nil, "bench.rules", nil)
	c := f.track(2, rollout.PhaseShadow, 1)
	req := limiter.Request{Principal: events.Principal{Kind: events.PrincipalBot, ID: "b"}, Route: "/channels/{channel_id}/messages"}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := 0
		for pb.Next() {
			i++
			c.Add(admission.PriorityCritical, i%8 == 0)
			c.AddPaired(admission.PriorityCritical, req, "default", i%8 == 0, i%16 == 0, i%2 == 0)
		}
	})
}
