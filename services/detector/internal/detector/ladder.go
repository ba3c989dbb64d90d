package detector

import (
	"fmt"
	"math"
	"time"

	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// Ladder is the graduated response: a penalty of one of Steps steps, from
// the mildest (a light multiplier for FirstTTL) to the pattern's full
// PatternPolicy. The first detection of an incident takes the step its
// evidence earns (a borderline case the first, a clear attack the last); a
// re-detection within the incident — the behaviour persisted past the
// cool-down — goes one step up. Steps 1 gives every detection the full
// penalty (the detector before the ladder).
type Ladder struct {
	Steps    int           // FLOODGATE_DETECTOR_LADDER_STEPS, 1..9
	FirstTTL time.Duration // FLOODGATE_DETECTOR_LADDER_FIRST_TTL: step 1's duration
}

// DefaultLadder is three steps, the first two minutes long.
func DefaultLadder() Ladder { return Ladder{Steps: 3, FirstTTL: 2 * time.Minute} }

// penalty is step k's multiplier and duration under policy: both move
// geometrically from the first step (multiplier policy^(1/Steps), FirstTTL)
// to the last (the policy's own), so each step is the same factor harsher.
func (l Ladder) penalty(policy PatternPolicy, k int) (float64, time.Duration) {
	if l.Steps <= 1 || k >= l.Steps {
		return policy.Multiplier, policy.TTL
	}
	f := float64(k) / float64(l.Steps)
	m := math.Pow(policy.Multiplier, f)
	first := min(l.FirstTTL, policy.TTL)
	g := float64(k-1) / float64(l.Steps-1)
	ttl := time.Duration(float64(first) * math.Pow(float64(policy.TTL)/float64(first), g))
	return m, ttl.Round(time.Second)
}

// Evidence grades, from a borderline case to a clear attack.
const (
	gradeBorderline = 1
	gradeClear      = 2
	gradeSevere     = 3
)

// firstStep is the step a detection's evidence earns, and why, in words a
// reviewer reads. The grade comes from the evidence margin: how far past
// its line the score is, how much of the principal's traffic the limiter
// refused, and how long the rate held.
func (l Ladder) firstStep(det *score.Detection) (int, string) {
	g, why := grade(det)
	step := max(1, int(math.Round(float64(g)*float64(l.Steps)/gradeSevere)))
	return step, fmt.Sprintf("step %d of %d, %s", step, l.Steps, why)
}

func grade(det *score.Detection) (int, string) {
	margin := det.Score / max(det.Threshold, 1e-9)
	switch det.Pattern {
	case score.RapidFire:
		if det.BaselineSource == score.SourceLimit {
			what := fmt.Sprintf("%.0f%% of its calls refused past its limit (%d refused)", 100*det.DenialRatio, det.Denials)
			switch {
			case det.DenialRatio >= 0.9 && det.Denials >= 100:
				return gradeSevere, "clear: " + what
			case det.DenialRatio >= 0.75:
				return gradeClear, what
			}
			return gradeBorderline, "borderline: " + what
		}
		what := fmt.Sprintf("%.1f× its line (%.1f/s against %.1f/s) held for %s", margin, det.ObservedRate, det.ExpectedRate*det.Threshold, det.Sustained)
		g := gradeBorderline
		switch {
		case margin >= 4:
			g = gradeSevere
		case margin >= 2:
			g = gradeClear
		}
		if det.Sustained >= det.Window && g < gradeSevere {
			g++ // held over the whole window, not only past a burst
		}
		return g, [...]string{"", "borderline: ", "", "clear: "}[g] + what
	case score.DistributedIP:
		what := fmt.Sprintf("%d unshared networks against a line of %d", det.UnsharedIPs, det.NetworkThreshold)
		if det.NewNetworks > 0 {
			what = fmt.Sprintf("%d new networks within the fan-out interval against a line of %d", det.NewNetworks, det.NetworkThreshold)
		}
		switch {
		case margin >= 3:
			return gradeSevere, "clear: " + what
		case margin >= 1.5:
			return gradeClear, what
		}
		return gradeBorderline, "borderline: " + what
	}
	return gradeBorderline, fmt.Sprintf("borderline: score %.2f against %.2f", det.Score, det.Threshold)
}
