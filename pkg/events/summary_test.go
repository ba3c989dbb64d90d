package events

import (
	"strings"
	"testing"
)

func TestEvidenceSummarySpeaksEachPatternsTerms(t *testing.T) {
	for _, tc := range []struct {
		name    string
		a       Abuse
		want    []string
		notWant []string
	}{
		{
			// A taken-over account spread over many addresses is slow: its
			// rate (5 events in 300 s) says nothing, its networks do.
			name: "distributed_ip",
			a: Abuse{Pattern: PatternDistributedIP, Window: Window{Seconds: 300},
				Evidence: Evidence{ObservedRate: 5.0 / 300, EventCount: 5, DistinctIPs: 5, DistinctIP24: 5,
					Basis: &Basis{Source: BasisNetworks, NewNetworks: 5, NetworkThreshold: 8}}},
			want:    []string{"5 distinct addresses (5 IPv4 /24s, 0 IPv6 /64s) in 300s", "5 networks new within seconds", "against a line of 8 unshared networks"},
			notWant: []string{"/s"},
		},
		{
			name: "rapid_fire against its baseline",
			a: Abuse{Pattern: PatternRapidFire, Window: Window{Seconds: 10},
				Evidence: Evidence{ObservedRate: 17.5, Threshold: 12.8, BaselineRate: 2.56, EventCount: 175}},
			want: []string{"17.5/s against a line of 12.8/s over 10s", "(expected 2.6/s)"},
		},
		{
			name: "rapid_fire of automation, against its limit",
			a: Abuse{Pattern: PatternRapidFire, Window: Window{Seconds: 10},
				Evidence: Evidence{ObservedRate: 4.5, Threshold: 3, Basis: &Basis{Source: BasisLimit, DenialRatio: 0.45}}},
			want: []string{"4.5/s against a line of 3.0/s over 10s", "45 % of its requests denied by its limit"},
		},
		{
			name: "a slow rate keeps its digits",
			a:    Abuse{Pattern: PatternBotLike, Window: Window{Seconds: 60}, Evidence: Evidence{ObservedRate: 0.2}},
			want: []string{"0.2/s over 60s"},
		},
	} {
		t.Run(tc.name, func(t *testing.T) {
			got := tc.a.EvidenceSummary()
			for _, w := range tc.want {
				if !strings.Contains(got, w) {
					t.Errorf("%q lacks %q", got, w)
				}
			}
			for _, w := range tc.notWant {
				if strings.Contains(got, w) {
					t.Errorf("%q has %q", got, w)
				}
			}
		})
	}
}
