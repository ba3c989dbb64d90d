package web

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// TestEvidenceChartFitsThePattern: a distributed_ip alert shows networks
// against the count that fires, never a rate bar of zeros; a bot's
// rapid_fire says it was measured against its limit.
func TestEvidenceChartFitsThePattern(t *testing.T) {
	dist := &events.Abuse{Pattern: events.PatternDistributedIP, Evidence: events.Evidence{
		DistinctIPs: 12, DistinctIP24: 11, DistinctIP64: 1,
		Basis: &events.Basis{Source: events.BasisNetworks, BaselineKind: events.PrincipalUser, NewNetworks: 9, NetworkThreshold: 8},
	}}
	svg, note := evidenceChart(dist)
	require.Contains(t, string(svg), "new nets 9.00")
	require.Contains(t, string(svg), "threshold 8.00")
	require.NotContains(t, string(svg), "/s</text>", "no rate bar")
	require.Contains(t, note, "fan-out")

	rf := &events.Abuse{Pattern: events.PatternRapidFire, Evidence: events.Evidence{
		ObservedRate: 200, BaselineRate: 40, Threshold: 80,
		Basis: &events.Basis{Source: events.BasisLimit, BaselineKind: events.PrincipalBot, DenialRatio: 0.8},
	}}
	svg, note = evidenceChart(rf)
	require.Contains(t, string(svg), "observed 200.00/s")
	require.Contains(t, note, "against its limit")
	require.Contains(t, note, "80 %")
}
