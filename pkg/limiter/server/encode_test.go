package server

import (
	"bytes"
	"encoding/json"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
)

// encodingJSON is what the server wrote before the hand-written encoder.
func encodingJSON(t testing.TB, id, corr string, r limiter.Result) []byte {
	var buf bytes.Buffer
	require.NoError(t, json.NewEncoder(&buf).Encode(checkResponse(id, corr, r)))
	return buf.Bytes()
}

func TestAppendCheckResponseMatchesEncodingJSON(t *testing.T) {
	cases := []struct {
		name string
		id   string
		r    limiter.Result
	}{
		{"allowed", "req-1", limiter.Result{Allowed: true, Tier: events.TierPrincipal, Rule: "bot-global", Limit: 50, Remaining: 49,
			ResetAfter: 20 * time.Millisecond, Period: time.Second, Penalty: 1, Scale: 1}},
		{"no rule applies", "0192f1a2-7b3c-7def-8123-456789abcdef", limiter.Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1, Scale: 1}},
		{"denied", "req-2", limiter.Result{Tier: events.TierResource, Rule: "channel-messages", Limit: 5, ResetAfter: 4200 * time.Millisecond,
			RetryAfter: 999 * time.Millisecond, Period: 5 * time.Second, Penalty: 1, Scale: 1}},
		{"penalty", "req-3", limiter.Result{Tier: events.TierPenalty, Rule: "bot-global", Limit: 12, ResetAfter: time.Second,
			RetryAfter: 80 * time.Millisecond, Period: time.Second, Penalty: 0.25, Scale: 1, NearLimit: false}},
		{"quota", "req-4", limiter.Result{Tier: events.TierQuota, Rule: "quota-bot-default", Limit: 86400, ResetAfter: 3 * time.Hour,
			RetryAfter: time.Hour, Period: 24 * time.Hour, Penalty: 1, Scale: 1}},
		{"reduced capacity", "req-5", limiter.Result{Tier: events.TierEndpoint, Rule: "channel-create", Limit: 2, ResetAfter: time.Hour,
			RetryAfter: time.Hour, Period: time.Hour, Penalty: 1, Scale: 0.333333333333}},
		{"degraded shadow near limit", "req-6", limiter.Result{Allowed: true, Tier: events.TierIP, Rule: "anonymous-per-ip", Limit: 1000, Remaining: 100,
			Period: time.Minute, Penalty: 1, Scale: 2.5, Shadow: true, NearLimit: true, Degraded: true, Error: "redis circuit open"}},
		{"tiny and huge floats", "req-7", limiter.Result{Allowed: true, Tier: events.TierPrincipal, Penalty: 1e-7, Scale: 1e21}},
		{"escaped strings", "a<b>&\"c", limiter.Result{Tier: "ip\"<x>", Rule: "r&", Error: "é\n", Degraded: true, Penalty: 1, Scale: 1, RetryAfter: time.Second}},
		{"shed, not down", "req-shed", limiter.Result{Tier: events.TierPrincipal, Rule: "p", Limit: 2, Error: limiter.ShedReason, Degraded: true, Penalty: 1, Scale: 1, RetryAfter: time.Second}},
		{"shed by priority", "req-prio", limiter.Result{Tier: events.TierPrincipal, Penalty: 1, Scale: 1, RetryAfter: 4500 * time.Millisecond,
			ResetAfter: 4500 * time.Millisecond, Priority: admission.PriorityBulk, Shed: true, Utilization: admission.StatusDegraded}},
		{"served while shedding", "req-crit", limiter.Result{Allowed: true, Tier: events.TierPrincipal, Rule: "p", Limit: 5, Remaining: 4,
			Period: time.Second, Penalty: 1, Scale: 1, Priority: admission.PriorityCritical, Utilization: admission.StatusCritical}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			require.Equal(t, string(encodingJSON(t, "dec-"+tc.id, tc.id, tc.r)), string(appendCheckResponse(nil, "dec-"+tc.id, tc.id, tc.r)))
		})
	}
}

func FuzzAppendCheckResponse(f *testing.F) {
	f.Add("req", "principal", "rule", false, 5, 3, int64(1000), int64(0), int64(1e9), 1.0, 1.0, false, "")
	f.Add("x\"<", "quota", "", true, -1, -7, int64(-5), int64(77), int64(0), 0.5, 1e-9, true, "redis unavailable")
	f.Fuzz(func(t *testing.T, id, tier, rule string, allowed bool, limit, remaining int, reset, retry, period int64,
		penalty, scale float64, degraded bool, errText string) {
		r := limiter.Result{Allowed: allowed, Tier: events.Tier(tier), Rule: rule, Limit: limit, Remaining: remaining,
			ResetAfter: time.Duration(reset), RetryAfter: time.Duration(retry), Period: time.Duration(period),
			Penalty: penalty, Scale: scale, Degraded: degraded, Error: errText}
		if _, err := json.Marshal(penalty); err != nil {
			return // NaN/Inf never reach the encoder
		}
		if _, err := json.Marshal(scale); err != nil {
			return
		}
		require.Equal(t, string(encodingJSON(t, id, id, r)), string(appendCheckResponse(nil, id, id, r)))
	})
}

func BenchmarkEncodeCheckResponse(b *testing.B) {
	r := limiter.Result{Tier: events.TierResource, Rule: "channel-messages", Limit: 5, ResetAfter: 4200 * time.Millisecond,
		RetryAfter: 999 * time.Millisecond, Period: 5 * time.Second, Penalty: 1, Scale: 1}
	b.Run("encoding-json", func(b *testing.B) {
		b.ReportAllocs()
		var buf bytes.Buffer
		for b.Loop() {
			buf.Reset()
			_ = json.NewEncoder(&buf).Encode(checkResponse("req-2", "req-2", r))
		}
	})
	b.Run("append", func(b *testing.B) {
		b.ReportAllocs()
		var buf []byte
		for b.Loop() {
			buf = appendCheckResponse(buf[:0], "req-2", "req-2", r)
		}
	})
}

func TestAppendBatchResponseMatchesEncodingJSON(t *testing.T) {
	answers := []batchAnswer{
		{id: "dec-0", corr: "req-0", res: limiter.Result{Allowed: true, Tier: events.TierPrincipal, Rule: "bot-global", Limit: 50, Remaining: 49,
			ResetAfter: 20 * time.Millisecond, Period: time.Second, Penalty: 1, Scale: 1}},
		{id: "req-1", invalid: &httpapi.Problem{Type: httpapi.ProblemInvalidRequest, Title: "Bad Request", Status: 400, Detail: `ip: "x<y" is not an address`, CorrelationID: "req-1"}},
		{id: "dec-2", corr: "req-2", res: limiter.Result{Tier: events.TierPenalty, Rule: "bot-global", Limit: 12, ResetAfter: time.Second,
			RetryAfter: 80 * time.Millisecond, Period: time.Second, Penalty: 0.25, Scale: 1}},
		{id: "dec-3", corr: "req-3", res: limiter.Result{Allowed: true, Tier: events.TierIP, Degraded: true, Error: "redis circuit open", Penalty: 1, Scale: 2.5, NearLimit: true}},
	}
	want := checkapi.BatchResponse{Results: make([]checkapi.BatchResult, len(answers))}
	for i, a := range answers {
		if a.invalid != nil {
			want.Results[i] = checkapi.BatchResult{Status: a.invalid.Status, Error: a.invalid}
			continue
		}
		resp := checkResponse(a.id, a.corr, a.res)
		want.Results[i] = checkapi.BatchResult{Status: 200, CheckResponse: &resp}
	}
	var buf bytes.Buffer
	require.NoError(t, json.NewEncoder(&buf).Encode(want))
	require.Equal(t, buf.String(), string(appendBatchResponse(nil, answers)))
}
