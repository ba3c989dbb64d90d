package precision

import (
	"net/netip"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

func abuseFrom(ip string, shared int64, routes ...string) *events.Abuse {
	a := &events.Abuse{}
	if ip != "" {
		a.Evidence.TopIPs = []events.IPCount{{IP: netip.MustParseAddr(ip), Count: 10, SharedPrincipals: shared}}
	}
	for _, r := range routes {
		a.Evidence.TopRoutes = append(a.Evidence.TopRoutes, events.RouteCount{Route: r, Count: 1})
	}
	return a
}

func TestNetwork(t *testing.T) {
	dc, err := ParsePrefixes([]string{"198.51.100.0/24", " 2001:db8:aa::/48"})
	require.NoError(t, err)
	c := Classifier{Datacenter: dc}
	tests := []struct {
		name string
		ev   *events.Abuse
		want string
	}{
		{"no event", nil, NetworkUnknown},
		{"no address", abuseFrom("", 0), NetworkUnknown},
		{"datacenter v4", abuseFrom("198.51.100.7", 40), NetworkDatacenter},
		{"datacenter v4-mapped", abuseFrom("::ffff:198.51.100.7", 0), NetworkDatacenter},
		{"datacenter v6", abuseFrom("2001:db8:aa:1::", 0), NetworkDatacenter},
		{"shared", abuseFrom("203.0.113.0", SharedMin), NetworkShared},
		{"just below shared", abuseFrom("203.0.113.0", SharedMin-1), NetworkIPv4},
		{"ipv6 /64", abuseFrom("2001:db8:1:2::", 0), NetworkIPv6},
		{"shared ipv6", abuseFrom("2001:db8:1:2::", 9), NetworkShared},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) { require.Equal(t, tt.want, c.Network(tt.ev)) })
	}
	_, err = ParsePrefixes([]string{"10.0.0.0/33"})
	require.Error(t, err)
	require.Equal(t, "/a", Route(abuseFrom("", 0, "/a", "/b")))
	require.Empty(t, Route(nil))
}

func TestParseThresholds(t *testing.T) {
	tests := []struct {
		in      string
		def     float64
		by      map[string]float64
		wantErr string
	}{
		{"", 0.95, map[string]float64{}, ""},
		{"0.9", 0.9, map[string]float64{}, ""},
		{"0.9, rapid_fire=0.99,distributed_ip=0.8", 0.9, map[string]float64{"rapid_fire": 0.99, "distributed_ip": 0.8}, ""},
		{"rapid_fire=1.5", 0, nil, "0..1"},
		{"nope=0.5", 0, nil, "not a pattern"},
		{"abc", 0, nil, "0..1"},
	}
	for _, tt := range tests {
		t.Run(tt.in, func(t *testing.T) {
			th, err := ParseThresholds(tt.in)
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.def, th.Default)
			require.Equal(t, tt.by, th.ByPattern)
			if v, ok := tt.by["rapid_fire"]; ok {
				require.Equal(t, v, th.For("rapid_fire"))
			}
			require.Equal(t, tt.def, th.For("scraping"))
		})
	}
}

func TestComputeAndBreaches(t *testing.T) {
	day := time.Date(2026, 11, 20, 0, 0, 0, 0, time.UTC)
	j := func(pattern, kind string, at time.Duration, v events.VerdictValue) Judged {
		return Judged{Pattern: pattern, Kind: kind, Route: "/r", Network: NetworkIPv4, DetectedAt: day.Add(at), Verdict: v}
	}
	js := []Judged{
		j("rapid_fire", "user", time.Hour, events.VerdictConfirmed),
		j("rapid_fire", "user", 2*time.Hour, events.VerdictFalsePositive),
		j("rapid_fire", "bot", 25*time.Hour, events.VerdictConfirmed),
		j("rapid_fire", "bot", 26*time.Hour, events.VerdictConfirmed),
		j("distributed_ip", "user", 49*time.Hour, events.VerdictConfirmed),
		j("distributed_ip", "user", 50*time.Hour, events.VerdictUnsure),
		j("distributed_ip", "user", -time.Hour, events.VerdictFalsePositive), // before the range
	}
	tb := Compute(js, DimPattern, day, day.Add(72*time.Hour-time.Second), 24*time.Hour)
	require.Len(t, tb.Starts, 3)
	require.Equal(t, "rapid_fire", tb.Rows[0].Value, "most judged first")
	p, ok := tb.Rows[0].Total.Precision()
	require.True(t, ok)
	require.InDelta(t, 0.75, p, 1e-9)
	require.Equal(t, "75.00 %", tb.Rows[0].Total.Percent())
	require.Equal(t, Count{Confirmed: 1, FalsePositive: 1}, tb.Rows[0].Buckets[0])
	require.Equal(t, Count{Confirmed: 2}, tb.Rows[0].Buckets[1])
	require.Equal(t, Count{}, tb.Rows[0].Buckets[2])
	require.Equal(t, Count{Confirmed: 1, Unsure: 1}, tb.Rows[1].Total, "unsure is counted, never judged")
	require.Equal(t, Count{Confirmed: 4, FalsePositive: 1, Unsure: 1}, tb.All.Total)
	_, ok = Count{Unsure: 3}.Precision()
	require.False(t, ok)
	require.Equal(t, "—", Count{Unsure: 3}.Percent())

	byKind := Compute(js, DimKind, day, day.Add(72*time.Hour), 24*time.Hour)
	require.Equal(t, []string{"user", "bot"}, []string{byKind.Rows[0].Value, byKind.Rows[1].Value})

	th := Thresholds{Default: 0.8, ByPattern: map[string]float64{"distributed_ip": 0.5}, MinJudged: 2}
	br := th.Breaches(tb)
	require.Len(t, br, 1)
	require.Equal(t, "rapid_fire", br[0].Pattern)
	require.Equal(t, 0.8, br[0].Threshold)
	th.MinJudged = 5
	require.Empty(t, th.Breaches(tb), "four judged verdicts are too few to decide")

	g := ByGroup(js, day)
	require.Equal(t, Count{Confirmed: 1, FalsePositive: 1}, g[Group{"rapid_fire", "user", "/r", NetworkIPv4}])
	require.Len(t, g, 3)
	_, err := ParseDim("colour")
	require.Error(t, err)
}
