package events

import (
	"fmt"
	"strings"
)

// EvidenceSummary is a detection's evidence in one line, in the terms its
// pattern compares: distinct networks against the count that fires for
// distributed_ip (a rate means nothing there: a taken-over account spread
// over hundreds of addresses is slow), the rate against its line for the
// rate patterns. Pages and the demo's log print it; the console draws the
// same comparison as a chart.
func (a *Abuse) EvidenceSummary() string {
	e := &a.Evidence
	var b strings.Builder
	switch {
	case a.Pattern == PatternDistributedIP:
		fmt.Fprintf(&b, "%d distinct addresses (%d IPv4 /24s, %d IPv6 /64s) in %ds", e.DistinctIPs, e.DistinctIP24, e.DistinctIP64, a.Window.Seconds)
		if bs := e.Basis; bs != nil {
			if bs.NewNetworks > 0 {
				fmt.Fprintf(&b, ", %d networks new within seconds", bs.NewNetworks)
			}
			if bs.NetworkThreshold > 0 {
				fmt.Fprintf(&b, " against a line of %d unshared networks", bs.NetworkThreshold)
			}
		}
	case e.Threshold > 0:
		fmt.Fprintf(&b, "%s against a line of %s over %ds", perSecond(e.ObservedRate), perSecond(e.Threshold), a.Window.Seconds)
		if e.BaselineRate > 0 {
			fmt.Fprintf(&b, " (expected %s)", perSecond(e.BaselineRate))
		}
	default:
		fmt.Fprintf(&b, "%s over %ds", perSecond(e.ObservedRate), a.Window.Seconds)
	}
	if bs := e.Basis; bs != nil && bs.Source == BasisLimit {
		fmt.Fprintf(&b, ", %.0f %% of its requests denied by its limit", 100*bs.DenialRatio)
	}
	return b.String()
}

// perSecond writes a rate of events with the precision it needs: 0.02/s
// is not 0.0/s.
func perSecond(r float64) string {
	switch {
	case r >= 100:
		return fmt.Sprintf("%.0f/s", r)
	case r >= 1:
		return fmt.Sprintf("%.1f/s", r)
	default:
		return fmt.Sprintf("%.2g/s", r)
	}
}
