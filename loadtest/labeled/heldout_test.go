package labeled

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

func heldOut(seed uint64) HeldOut {
	return HeldOut{Seed: seed, Start: time.Date(2026, 3, 1, 12, 0, 0, 0, time.UTC), Duration: 3 * time.Minute, Legit: 3000, Abusive: 60, Prefix: "t_"}
}

// TestHeldOut checks what the quality run relies on: every event valid
// decision.v1, the same seed the same stream, every family present, abuse
// starting inside the run, legitimate traffic inside its limits (the limiter
// model denies almost none of it) and abusive rate families denied.
func TestHeldOut(t *testing.T) {
	run := func(seed uint64) ([]events.Decision, map[string]*Label) {
		s, err := NewHeldOut(heldOut(seed))
		require.NoError(t, err)
		return s.All(), s.Labels()
	}
	a, labels := run(7)
	b, _ := run(7)
	require.Equal(t, a, b, "same seed, same stream")
	c, _ := run(8)
	require.NotEqual(t, len(a), len(c), "another seed, another stream")

	require.ElementsMatch(t, func() []string {
		var n []string
		for _, f := range Families() {
			n = append(n, f.Name)
		}
		return n
	}(), FamilyNames(labels))

	type tally struct{ events, denied int }
	fam := map[string]*tally{}
	seen := map[string]bool{}
	last := time.Time{}
	for i := range a {
		d := &a[i]
		_, err := events.EncodeDecision(d)
		require.NoError(t, err, "event %d", i)
		require.False(t, d.TS.Before(last), "time order")
		last = d.TS
		l := labels[d.Principal.Key()]
		require.NotNil(t, l, d.Principal.Key())
		seen[d.Principal.Key()] = true
		if fam[l.Family] == nil {
			fam[l.Family] = &tally{}
		}
		fam[l.Family].events++
		if !d.Allowed {
			fam[l.Family].denied++
		}
		require.LessOrEqual(t, d.Remaining, d.Limit)
	}
	nLegit, nAbusive := 0, 0
	for _, l := range labels {
		if l.Abusive {
			nAbusive++
		} else {
			nLegit++
		}
	}
	require.Equal(t, heldOut(7).Legit, nLegit, "legitimate principals")
	require.Equal(t, heldOut(7).Abusive, nAbusive, "abusive principals")
	for k, l := range labels {
		if l.Abusive {
			require.False(t, l.AbuseStart.IsZero(), "%s has an abuse start", k)
			require.True(t, l.AbuseStart.Before(heldOut(7).Start.Add(3*time.Minute)), k)
			require.NotEmpty(t, l.Pattern, k)
		}
	}
	for _, f := range Families() {
		tl := fam[f.Name]
		require.NotNil(t, tl, "family %s sent nothing", f.Name)
		if !f.Abusive {
			require.LessOrEqual(t, float64(tl.denied), 0.001*float64(tl.events), "%s: legitimate traffic denied %d of %d", f.Name, tl.denied, tl.events)
		}
	}
	for _, f := range []string{"scraper", "cold_blast", "pulse"} {
		require.Greater(t, fam[f].denied, 0, "%s runs over its limits", f)
	}
	t.Logf("%d events, %d principals sent", len(a), len(seen))
}

func TestHeldOutValidate(t *testing.T) {
	h := heldOut(1)
	h.Duration = time.Minute
	_, err := NewHeldOut(h)
	require.ErrorContains(t, err, "duration")
}

// TestHeldOutRFC3986Routes: the flag adds routes with "@" (Discord's
// /users/@me), and only the flag does.
func TestHeldOutRFC3986Routes(t *testing.T) {
	for _, on := range []bool{false, true} {
		h := heldOut(3)
		h.Legit, h.RFC3986Routes = 500, on
		s, err := NewHeldOut(h)
		require.NoError(t, err)
		at := 0
		var d events.Decision
		for s.Next(&d) {
			if strings.Contains(d.Route, "@") {
				at++
			}
		}
		require.Equal(t, on, at > 0, "routes with @ when the flag is %v: %d", on, at)
	}
}
