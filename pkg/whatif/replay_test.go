package whatif

import (
	"context"
	"net/netip"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

const dimsCandidate = `
version: 1
priorities:
  - {method: POST, route: /v1/charges, priority: critical}
rules:
  - {id: charges, tier: endpoint, method: POST, route: /v1/charges, limit: 5, period: 1h}
  - {id: pro-export, tier: endpoint, plans: [pro], method: GET, route: /v1/export, limit: 2, period: 1h}
  - {id: anon, tier: endpoint, method: GET, route: /anon, limit: 4, period: 1h}
`

// dimsTraffic is recorded traffic whose every count under dimsCandidate is
// known by hand (see the test).
func dimsTraffic() []Recorded {
	t0 := time.Date(2026, 11, 20, 10, 0, 0, 0, time.UTC)
	ip := netip.MustParseAddr("192.0.2.10")
	var ds []events.Decision
	at := func(s int) time.Time { return t0.Add(time.Duration(s) * time.Second) }
	b1 := events.Principal{Kind: events.PrincipalBot, ID: "b1"}
	for i := range 10 { // allowed as recorded; the candidate's charges rule allows 5
		d := decision(len(ds), at(i), b1, ip, "POST", "/v1/charges", true, "")
		d.Plan, d.Priority = "default", events.PriorityCritical
		ds = append(ds, d)
	}
	u1 := events.Principal{Kind: events.PrincipalUser, ID: "u1"}
	for i := range 4 { // last two blocked by a rule the candidate drops; pro-export blocks them too
		d := decision(len(ds), at(20+i), u1, ip, "GET", "/v1/export", i < 2, "old-export")
		d.Plan = "pro"
		ds = append(ds, d)
	}
	u2 := events.Principal{Kind: events.PrincipalUser, ID: "u2"}
	for i := range 3 { // all blocked as recorded; the candidate allows 2
		d := decision(len(ds), at(30+i), u2, ip, "GET", "/v1/export", false, "old-export")
		d.Plan = "pro"
		ds = append(ds, d)
	}
	k1 := events.Principal{Kind: events.PrincipalAPIKey, ID: "k1"}
	for i := range 2 { // shed: not replayed
		d := decision(len(ds), at(40+i), k1, ip, "GET", "/x", false, "")
		d.Shed, d.Plan = true, "pro"
		ds = append(ds, d)
	}
	// An Envoy call for an envoy-configured domain: its configuration decided, not a rules file.
	d := decision(len(ds), at(45), k1, ip, "GET", "/d/k_v/k", false, "override:/d/k")
	d.Envoy = &events.EnvoyCall{Domain: "d", Descriptors: []events.EnvoyDescriptor{{Entries: []events.EnvoyEntry{{Key: "k", Value: "v"}}}}}
	ds = append(ds, d)
	a1 := events.Principal{Kind: events.PrincipalAnonymous, ID: "a1"}
	ds = append(ds, decision(len(ds), at(50), a1, ip, "GET", "/x", true, "")) // no plan recorded
	a2 := events.Principal{Kind: events.PrincipalAnonymous, ID: "a2"}
	for i := range 4 { // a penalty of 0.5 halves anon's 4: 2 allowed
		d := decision(len(ds), at(60+i), a2, ip, "GET", "/anon", true, "")
		d.Plan, d.PenaltyMultiplier = "default", 0.5
		ds = append(ds, d)
	}
	recs := make([]Recorded, len(ds))
	for i := range ds {
		recs[i] = Recorded{Decision: ds[i], Offset: int64(i)}
	}
	return recs
}

func TestReplayCountsEveryDimension(t *testing.T) {
	rdb := redistest.Client(t)
	prefix := PrefixBase + redistest.Unique(t, "dims") + ":"
	rep, err := Replay(context.Background(), Config{Redis: rdb, Candidate: rules(t, "candidate.yaml", dimsCandidate), Prefix: prefix}, dimsTraffic())
	require.NoError(t, err)

	require.Equal(t, 22, rep.Replayed)
	require.Equal(t, 2, rep.Shed)
	require.Equal(t, 1, rep.Envoy)
	require.Equal(t, 1, rep.NoPlan)
	require.Equal(t, Counts{Total: 22, BlockedRecorded: 5, BlockedCandidate: 10, NewlyBlocked: 7, NewlyAllowed: 2}, rep.Total)

	rule := map[string]RuleRow{}
	for _, r := range rep.ByRule {
		rule[r.Rule] = r
	}
	require.Equal(t, RuleRow{Rule: "charges", InCandidate: true, Matched: 10,
		Counts: Counts{Total: 5, BlockedCandidate: 5, NewlyBlocked: 5}}, rule["charges"])
	require.Equal(t, RuleRow{Rule: "pro-export", InCandidate: true, Matched: 7,
		Counts: Counts{Total: 3, BlockedCandidate: 3}}, rule["pro-export"])
	require.Equal(t, RuleRow{Rule: "anon", InCandidate: true, Matched: 4,
		Counts: Counts{Total: 2, BlockedCandidate: 2, NewlyBlocked: 2}}, rule["anon"])
	require.Equal(t, RuleRow{Rule: "old-export",
		Counts: Counts{Total: 5, BlockedRecorded: 5, NewlyAllowed: 2}}, rule["old-export"])
	require.Equal(t, []string{"charges", "pro-export", "anon", "old-export"}, []string{rep.ByRule[0].Rule, rep.ByRule[1].Rule, rep.ByRule[2].Rule, rep.ByRule[3].Rule})

	require.Equal(t, []Row{
		{Key: "critical", Counts: Counts{Total: 10, BlockedCandidate: 5, NewlyBlocked: 5}},
		{Key: "degraded", Counts: Counts{Total: 12, BlockedRecorded: 5, BlockedCandidate: 5, NewlyBlocked: 2, NewlyAllowed: 2}},
	}, rep.ByPrio)
	require.Equal(t, []Row{
		{Key: "default", Counts: Counts{Total: 15, BlockedCandidate: 7, NewlyBlocked: 7}},
		{Key: "pro", Counts: Counts{Total: 7, BlockedRecorded: 5, BlockedCandidate: 3, NewlyAllowed: 2}},
	}, rep.ByPlan)
	require.Equal(t, []Row{
		{Key: "user", Counts: Counts{Total: 7, BlockedRecorded: 5, BlockedCandidate: 3, NewlyAllowed: 2}},
		{Key: "bot", Counts: Counts{Total: 10, BlockedCandidate: 5, NewlyBlocked: 5}},
		{Key: "anonymous", Counts: Counts{Total: 5, BlockedCandidate: 2, NewlyBlocked: 2}},
	}, rep.ByKind)
	require.Equal(t, []Affected{
		{Key: "bot:b1", Plan: "default", NewlyBlocked: 5},
		{Key: "anonymous:a2", Plan: "default", NewlyBlocked: 2},
		{Key: "user:u2", Plan: "pro", NewlyAllowed: 2},
	}, rep.TopPrincipals)
	require.Equal(t, []Affected{{Key: "pro", Total: 7, NewlyAllowed: 2}}, rep.TopPlans)

	require.Equal(t, VerdictReject, rep.Verdict)
	require.Contains(t, rep.Reasons[0], "blocks 50.00 % of the critical traffic that was allowed (5 of 10)")
	require.Equal(t, "low", rep.Confidence)
	require.Contains(t, strings.Join(rep.Caveats, "\n"), "1 decisions carry no plan")

	// The isolated keys are gone.
	n, err := DeleteKeys(context.Background(), rdb, prefix)
	require.NoError(t, err)
	require.Zero(t, n, "the replay deleted its keyspace")

	var text strings.Builder
	require.NoError(t, rep.WriteText(&text))
	require.Contains(t, text.String(), "verdict: REJECT (confidence low)")
	require.Contains(t, text.String(), "bot:b1 (plan default): newly blocked 5, newly allowed 0")
	var js strings.Builder
	require.NoError(t, rep.WriteJSON(&js))
	require.Contains(t, js.String(), `"newly_blocked": 7`)
}

func TestVerdictThresholds(t *testing.T) {
	critical := func(nb int) *Report {
		return &Report{Replayed: 1000, Baseline: "b.yaml",
			Total:  Counts{Total: 1000, NewlyBlocked: nb},
			ByPrio: []Row{{Key: "critical", Counts: Counts{Total: 100, NewlyBlocked: nb}}}}
	}
	for _, tc := range []struct {
		name string
		nb   int
		th   Thresholds
		want string
	}{
		{"nothing newly blocked", 0, Thresholds{}, VerdictSafe},
		{"5 % of critical is not over 5 %", 5, Thresholds{}, VerdictReview},
		{"6 % of critical", 6, Thresholds{}, VerdictReject},
		{"6 % under a 10 % threshold", 6, Thresholds{RejectCritical: 0.1}, VerdictReview},
		{"11 % over a 10 % threshold", 11, Thresholds{RejectCritical: 0.1}, VerdictReject},
	} {
		t.Run(tc.name, func(t *testing.T) {
			r := critical(tc.nb)
			r.judge(tc.th)
			require.Equal(t, tc.want, r.Verdict, r.Reasons)
			require.Equal(t, "high", r.Confidence)
		})
	}
	t.Run("paying plan over the review share", func(t *testing.T) {
		r := &Report{Replayed: 1000, Baseline: "b.yaml", Total: Counts{Total: 1000, NewlyBlocked: 2},
			ByPlan: []Row{{Key: "enterprise", Counts: Counts{Total: 100, NewlyBlocked: 2}}, {Key: "free", Counts: Counts{Total: 10, NewlyBlocked: 5}}}}
		r.judge(Thresholds{})
		require.Equal(t, VerdictReview, r.Verdict)
		require.Len(t, r.Reasons, 1)
		require.Contains(t, r.Reasons[0], "paying plan enterprise")
	})
	t.Run("invalid", func(t *testing.T) {
		require.Error(t, Thresholds{RejectCritical: 1.5}.Validate())
	})
}
