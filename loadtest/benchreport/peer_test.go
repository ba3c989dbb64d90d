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
