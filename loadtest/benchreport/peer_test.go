package benchreport

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
)

// TestPeerTablePinned: a pinned peerbench report shows each service's calls
// per core-second, its cores' busy shares and invalid rounds, the floor's
// row, and the ratios per core-second and to the floor.
func TestPeerTablePinned(t *testing.T) {
	svc := func(name string, us float64, invalid int) envoypeer.ServiceResult {
		return envoypeer.ServiceResult{Name: name, Calls: 1000, CallsPerSec: 20000, CPU: envoypeer.CallCPU{Service: us},
			Rounds: 2, Invalid: invalid, AllInvalid: invalid == 2, CoreBusy: []float64{0.8, 0.95}}
	}
	p := &envoypeer.Report{Rounds: 2, Duration: "5s", Callers: 64, Conns: 4, Users: 10000, Placement: "pinned: the service under test on cpu 1 alone",
		Comparisons: []envoypeer.Comparison{{Protocol: "grpc", Ratio: 1.5, ServiceCPURatio: 33.0 / 11, FloorCPURatio: 8.0 / 11,
			Services: []envoypeer.ServiceResult{svc("envoy ratelimit", 33, 0), svc("floodgate", 11, 1), svc("floor (does nothing)", 8, 2)}}}}
	out := peerTable(p)
	for _, want := range []string{
		"Placement: pinned: the service under test on cpu 1 alone.",
		"| grpc | floodgate | 20,000 |",
		"| 90,909 | cpu0 80 % cpu1 95 % | 2 (1) |",
		"| 125,000 | cpu0 80 % cpu1 95 % | 2 (2) **all invalid** |",
		"**3.00×** per service core-second; Floodgate's CPU per call is 1.38× the do-nothing floor's",
	} {
		require.Contains(t, out, want)
	}
}

// TestPeerTargetsPinned: a pinned report is judged per service core-second
// (gRPC 3×, HTTP 2×) and against the floor (1.5×); a comparison whose
// rounds were all INVALID is never met, whatever its ratio.
func TestPeerTargetsPinned(t *testing.T) {
	svc := func(name string, us float64, allInvalid bool) envoypeer.ServiceResult {
		n := 0
		if allInvalid {
			n = 2
		}
		return envoypeer.ServiceResult{Name: name, CallsPerSec: 1000, CPU: envoypeer.CallCPU{Service: us}, Rounds: 2, Invalid: n, AllInvalid: allInvalid}
	}
	peer := &envoypeer.Report{Placement: "pinned", Comparisons: []envoypeer.Comparison{
		{Protocol: "grpc", ServiceCPURatio: 3.3, FloorCPURatio: 0.8,
			Services: []envoypeer.ServiceResult{svc("envoy ratelimit", 33, false), svc("floodgate", 10, false), svc("floor (does nothing)", 8, false)}},
		{Protocol: "http", ServiceCPURatio: 2.5, FloorCPURatio: 0.9,
			Services: []envoypeer.ServiceResult{svc("envoy ratelimit", 40, true), svc("floodgate", 16, true), svc("floor (does nothing)", 14.4, true)}},
	}}
	rep := &Report{values: map[string]Val{}, Sections: []*SectionResult{{Steps: []*StepResult{{Step: &Step{ID: "limiter-peer"}, Peer: peer}}}}}
	out := rep.targetsMarkdown()
	for _, want := range []string{
		"| limiter ≥ 3× envoy ratelimit per service core-second over grpc (pinned, same run) | 3.30× (10.0 vs 33.0 µs service CPU per call) | **yes** |",
		"| limiter within 1.5× of the do-nothing grpc floor's CPU per call (pinned, same run) | 1.25× (10.0 vs 8.0 µs) | **yes** |",
		"| limiter ≥ 2× envoy ratelimit per service core-second over http (pinned, same run) | 2.50× (16.0 vs 40.0 µs service CPU per call), every round INVALID (generator's cores over 90 % busy) | **no** |",
		"| limiter within 1.5× of the do-nothing http floor's CPU per call (pinned, same run) | 1.11× (16.0 vs 14.4 µs) | **no** |",
	} {
		require.Contains(t, out, want)
	}
	require.NotContains(t, out, "(same run, Redis and rule) |", "a pinned run is not judged in calls/s")
}
