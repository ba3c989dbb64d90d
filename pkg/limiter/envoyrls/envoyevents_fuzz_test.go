package envoyrls

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
)

// fuzzEnvoyConfig has a named limit, an unnamed one under a long wildcard
// path, a shadow and a quota limit: the routes and rule names an event can
// take from a configuration.
const fuzzEnvoyConfig = `domain: fuzz
descriptors:
  - key: user
    rate_limit: {unit: second, requests_per_unit: 10, name: per-user}
  - key: remote_address
    rate_limit: {unit: minute, requests_per_unit: 100}
  - key: path
    value: "/ü/väry/lóng/*"
    rate_limit: {unit: hour, requests_per_unit: 5}
    shadow_mode: true
  - key: api_key
    rate_limit: {unit: day, requests_per_unit: 1000}
    quota_mode: true
`

// The Envoy path encodes its events without validating them again
// (events.AppendDecisionUnchecked, in server.Emit), so envoyDecision must
// build a valid decision.v1 event from any call a client can send and any
// answer the evaluator can give: checked here against Validate and against
// what the validating encoder writes.
func FuzzEnvoyDecisionIsValid(f *testing.F) {
	cfg, err := envoyconf.Load([]envoyconf.File{{Name: "fuzz.yaml", Data: []byte(fuzzEnvoyConfig)}}, envoyconf.Options{})
	require.NoError(f, err)
	f.Add("fuzz", "user", "alice", "remote_address", "203.0.113.9", ":method", "POST", uint8(0), uint32(10), uint32(3), uint64(7), 1.0, uint8(0), uint32(1), uint64(0), int64(1_764_400_000_000), false, int64(0))
	f.Add("\x00", "user", "", "remote_address", "2001:db8::1", "path", "/ü/väry/lóng/x", uint8(2), uint32(5), uint32(0), uint64(9), 0.5, uint8(1), uint32(0), uint64(1<<40), int64(-5), true, int64(1<<40))
	f.Add(strings.Repeat("d", 300), "api_key", "k\x7f\xff", "user", strings.Repeat("é", 200), "path", "x", uint8(3), uint32(0), uint32(1<<31), uint64(1<<63), -1.0, uint8(2), uint32(1<<31), uint64(3), int64(253402300799999), false, int64(-1))
	// hits past the schema's cost bound, on the call and on the deciding descriptor
	f.Add("fuzz", "user", "bob", "remote_address", "198.51.100.1", "path", "/p", uint8(0), uint32(10), uint32(0), uint64(11), 1.0, uint8(0), uint32(5_000_000), uint64(1<<40), int64(0), false, int64(0))
	f.Add("fuzz", "user", "bob", "remote_address", "198.51.100.1", "path", "/p", uint8(1), uint32(10), uint32(0), uint64(11), 1.0, uint8(2), uint32(1), uint64(1<<40), int64(0), false, int64(0))
	// no client address
	f.Add("fuzz", "user", "carol", "path", "/q", "api_key", "k1", uint8(4), uint32(3), uint32(3), uint64(0), 0.25, uint8(1), uint32(0), uint64(0), int64(1), false, int64(50))
	id := EnvoyIdentity{Keys: []EnvoyPrincipalKey{{"user", events.PrincipalUser}, {"api_key", events.PrincipalAPIKey}, {"remote_address", events.PrincipalAnonymous}},
		IPKey: "remote_address", MethodKey: ":method"}
	f.Fuzz(func(t *testing.T, domain, k1, v1, k2, v2, k3, v3 string, pick uint8, effective, remaining uint32, count uint64,
		penalty float64, code uint8, descHits uint32, callHits uint64, nowMS int64, quotaDenies bool, quotaLimit int64) {
		req := envoyconf.Request{Domain: domain, HitsAddend: descHits, Descriptors: []envoyconf.Descriptor{
			{Entries: []envoyconf.Entry{{Key: k1, Value: v1}}, HitsAddend: &callHits},
			{Entries: []envoyconf.Entry{{Key: k2, Value: v2}, {Key: k3, Value: v3}}},
			{Entries: []envoyconf.Entry{{Key: k3, Value: v3}}},
		}}
		if pick%5 == 4 {
			req.Descriptors[1].Override = &envoyconf.Override{RequestsPerUnit: effective, Unit: envoyconf.Unit(1 + pick%4)}
		}
		who := id.identify(req.Descriptors)
		if !who.ok {
			return // no principal: no event (counted as unnamed)
		}
		tiers := who.tiers(&req, id.IPKey)
		resp := envoyconf.Response{Overall: envoyconf.CodeOK, Penalty: penalty, Now: time.UnixMilli(nowMS % (253402300799999 + 1)).UTC(),
			Degraded: pick%7 == 0}
		if resp.Now.Before(time.Unix(0, 0)) {
			resp.Now = time.Unix(0, 0).UTC()
		}
		for i, d := range req.Descriptors {
			m := cfg.Lookup(req.Domain, d.Entries)
			if m.Limit == nil {
				// Any limit of the configuration may answer: the lookup
				// needs "fuzz" and a configured key.
				m = cfg.Lookup("fuzz", []envoyconf.Entry{{Key: []string{"user", "remote_address", "path", "api_key"}[(int(pick)+i)%4], Value: "/ü/väry/lóng/z"}})
			}
			st := envoyconf.Status{Code: envoyconf.CodeOK, Limit: m.Limit, Override: d.Override, LimitRemaining: remaining,
				Count: count, Effective: effective, Penalty: penalty, Scale: 1}
			if m.Limit != nil {
				st.Shadowed, st.QuotaExceeded = m.Limit.ShadowMode && code%3 == 1, m.Limit.QuotaMode && code%3 == 2
			}
			if int(code)%len(req.Descriptors) == i && code%3 == 0 {
				st.Code, resp.Overall = envoyconf.CodeOverLimit, envoyconf.CodeOverLimit
			}
			resp.Statuses = append(resp.Statuses, st)
		}
		sc := newEnvoyScratch()
		defer sc.release()
		ev := envoyDecision(sc.decisionID(), "fuzz-gateway", &who, &req, &resp, tiers, sc)
		if quotaLimit != 0 { // the principal has a daily quota
			decideQuota(&limiter.QuotaAnswer{ID: "quota-user-free", Allowed: !quotaDenies, WouldDeny: quotaDenies || pick%2 == 1,
				Limit: max(quotaLimit%events.MaxSafeInteger, 0), Units: envoyUnits(&req, tiers)}, &ev)
		}
		require.NoError(t, ev.Validate())
		want, err := events.AppendDecision(nil, &ev)
		require.NoError(t, err)
		require.Equal(t, string(want), string(events.AppendDecisionUnchecked(nil, &ev)))

		un := envoyUnavailable(sc.decisionID(), "fuzz-gateway", &who, &req, pick%2 == 0, tiers, sc)
		require.NoError(t, un.Validate())
	})
}
