package limiter

import (
	"os"
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
	benchEngine(b, rdb, []engineBench{
		{"one-tier", "version: 1\nrules:\n  - {id: p, tier: principal, limit: 1000000000, period: 1s}\n", events.PrincipalBot,
			Request{Method: "GET", Route: "/x", Cost: 1}, false, 0, true},
		{"discord-grid-bot-message", string(data), events.PrincipalBot,
			Request{Method: "POST", Route: "/channels/{channel_id}/messages", Resource: "channel:1", Cost: 1}, false, 0, true},
	})
}
