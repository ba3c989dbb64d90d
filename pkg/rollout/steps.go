package rollout

import (
	"errors"
	"fmt"
	"math"
	"strconv"
	"strings"
	"time"

	"github.com/google/uuid"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Gradual rollout (docs/rollouts.md): after its shadow period a candidate is
// enforced for a growing slice of principals, one step at a time. A step's
// slice is a share of the principal-hash space in basis points (100 = 1 %);
// the limiter replicas all hash a principal's key the same way
// (limiter.PrincipalSlice), so a principal is inside or outside a step on
// every replica. The candidate's record stays in state shadow with Step set:
// principals outside the slice still get the parent's answers, and both
// versions keep judging every request, so the per-class comparison against
// the parent goes on during every step.

// DefaultSteps are the steps a rollout takes when its parameters name none.
const DefaultSteps = "1,10,50,100"

// BasisPoints is the whole principal-hash space.
const BasisPoints = 10_000

// maxSteps bounds a rollout's steps (the schema's step maximum).
const maxSteps = 16

// ParseSteps reads steps ("1,10,50,100": percentages of principals,
// increasing, the last 100, at most two decimals) into basis points.
func ParseSteps(s string) ([]int64, error) {
	if strings.TrimSpace(s) == "" {
		return nil, fmt.Errorf("steps: at least one step required (e.g. %s)", DefaultSteps)
	}
	parts := strings.Split(s, ",")
	if len(parts) > maxSteps {
		return nil, fmt.Errorf("steps %q: at most %d steps", s, maxSteps)
	}
	out := make([]int64, 0, len(parts))
	for _, p := range parts {
		f, err := strconv.ParseFloat(strings.TrimSpace(p), 64)
		if err != nil || math.IsNaN(f) || f <= 0 || f > 100 {
			return nil, fmt.Errorf("steps %q: %q is not a percentage in (0, 100]", s, p)
		}
		bp := math.Round(f * 100)
		if math.Abs(bp-f*100) > 1e-6 {
			return nil, fmt.Errorf("steps %q: %q has more than two decimals (the slices are basis points)", s, p)
		}
		if len(out) > 0 && int64(bp) <= out[len(out)-1] {
			return nil, fmt.Errorf("steps %q: each step must cover more principals than the one before", s)
		}
		out = append(out, int64(bp))
	}
	if out[len(out)-1] != BasisPoints {
		return nil, fmt.Errorf("steps %q: the last step must be 100 (every principal)", s)
	}
	return out, nil
}

// FormatSteps writes basis points back as ParseSteps reads them.
func FormatSteps(bps []int64) string {
	parts := make([]string, len(bps))
	for i, bp := range bps {
		parts[i] = strconv.FormatFloat(float64(bp)/100, 'f', -1, 64)
	}
	return strings.Join(parts, ",")
}

// StepList is the version's steps in basis points (nil: none, promoted at
// once after the shadow period; also nil when the record's steps do not
// parse, which Validate refuses before publishing).
func (e Entry) StepList() []int64 {
	if e.Steps == "" {
		return nil
	}
	bps, err := ParseSteps(e.Steps)
	if err != nil {
		return nil
	}
	return bps
}

// StepWindow is how long each step is watched (the shadow period when the
// record names none).
func (e Entry) StepWindow() time.Duration {
	if e.StepWindowMs > 0 {
		return time.Duration(e.StepWindowMs) * time.Millisecond
	}
	return e.ShadowFor()
}

// SliceBP is the slice of principals the candidate is enforced for, in
// basis points: 0 in the shadow period.
func (e Entry) SliceBP() int64 {
	steps := e.StepList()
	if e.Step < 1 || int(e.Step) > len(steps) {
		return 0
	}
	return steps[e.Step-1]
}

// StepName names the step for reasons and pages: "shadow", "step 2 of 4 (10 %)".
func (e Entry) StepName() string {
	if e.Step < 1 {
		return "shadow"
	}
	return fmt.Sprintf("step %d of %d (%s)", e.Step, len(e.StepList()), bpPct(e.SliceBP()))
}

// bpPct formats basis points as a percentage: "1 %", "0.5 %".
func bpPct(bp int64) string {
	return strconv.FormatFloat(float64(bp)/100, 'f', -1, 64) + " %"
}

// PlanStep moves candidate version v from its step to the next (from the
// shadow period to step 1): a new record of the candidate, state shadow,
// Step one more, its ts the step's start.
func PlanStep(st *State, v int64, a Actor, now time.Time) (Plan, error) {
	if err := a.check(); err != nil {
		return Plan{}, err
	}
	c, ok := st.Candidate()
	if !ok || (v != 0 && c.Version != v) {
		return Plan{}, ErrNoCandidate
	}
	if int(c.Step) >= len(c.StepList()) {
		return Plan{}, fmt.Errorf("version %d is at its last step: %w", c.Version, ErrNoStep)
	}
	r := c.RulesVersion
	r.ID, r.TS, r.Author, r.Reason = uuid.Must(uuid.NewV7()).String(), now.UTC().Truncate(time.Millisecond), a.Name, a.Reason
	r.Step++
	return Plan{Action: ActionStep, Version: c.Version, Records: []events.RulesVersion{r}}, nil
}

// ErrNoStep: the candidate has no step after the one it is at.
var ErrNoStep = errors.New("no further step")

// PlanStepRollback rolls candidate version v back at its step: the
// candidate's record is published rolled_back, and every principal gets the
// parent's answers again (the parent never stopped being enforced for the
// principals outside the slice).
func PlanStepRollback(st *State, v int64, a Actor, now time.Time) (Plan, error) {
	return planCandidate(st, v, a, now, ActionRollback, events.RulesStateRolledBack)
}
