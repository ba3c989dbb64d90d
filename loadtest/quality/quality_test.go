package quality

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestScore checks the instrument's arithmetic on hand-made detections: a
// penalized legitimate principal counts as a false positive, an abuser
// without a penalty key is not caught, latencies run from the abuse start
// and fan-out latency is kept apart.
func TestScore(t *testing.T) {
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	p := func(id string) events.Principal { return events.Principal{Kind: events.PrincipalUser, ID: "r_" + id} }
	labels := map[string]*labeled.Label{}
	add := func(id, fam string, abusive bool, start time.Time, pat events.Pattern) {
		labels[p(id).Key()] = &labeled.Label{Principal: p(id), Population: fam, Family: fam, Abusive: abusive, AbuseStart: start, Pattern: pat}
	}
	add("h1", "human", false, time.Time{}, "")
	add("h2", "human", false, time.Time{}, "")
	add("b1", "bot", false, time.Time{}, "")
	add("s1", "scraper", true, t0, events.PatternRapidFire)
	add("s2", "scraper", true, t0, events.PatternRapidFire)
	add("f1", "ato", true, t0, events.PatternDistributedIP)
	add("c1", "credential_stuffing", true, t0, events.PatternDistributedIP)
	first := map[string]events.Abuse{
		p("b1").Key(): {Principal: p("b1"), Pattern: events.PatternRapidFire, DetectedAt: t0},
		p("s1").Key(): {Principal: p("s1"), Pattern: events.PatternRapidFire, DetectedAt: t0.Add(300 * time.Millisecond)},
		p("s2").Key(): {Principal: p("s2"), Pattern: events.PatternBotLike, DetectedAt: t0.Add(time.Second)},
		p("f1").Key(): {Principal: p("f1"), Pattern: events.PatternDistributedIP, DetectedAt: t0.Add(8 * time.Second)},
		p("c1").Key(): {Principal: p("c1"), Pattern: events.PatternDistributedIP, DetectedAt: t0.Add(10 * time.Second)},
	}
	pen := map[string]bool{p("b1").Key(): true, p("s1").Key(): true, p("f1").Key(): true}
	var r Result
	score(&r, labels, first, pen, "r_")
	require.Equal(t, 3, r.Legit)
	require.Equal(t, 1, r.LegitPenalized)
	require.Equal(t, 1, r.LegitDetected)
	require.Equal(t, 4, r.Abusive)
	require.Equal(t, 2, r.Caught, "s2 and c1 were detected but have no penalty key")
	require.Equal(t, 10*time.Second, r.FanOutP99, "every distributed_ip is breadth, not only the takeover")
	require.Equal(t, time.Second, r.RateP99, "breadth stays out of the rate pattern's latency")
	require.Equal(t, events.PatternBotLike, r.detected["s2"], "ids lose the run prefix")
	var sc Family
	for _, f := range r.Families {
		if f.Name == "scraper" {
			sc = f
		}
	}
	require.Equal(t, Family{Name: "scraper", Abusive: true, Pattern: events.PatternRapidFire, Principals: 2, Detected: 2, Penalized: 1, AsExpected: 1,
		LatP50: time.Second, LatP99: time.Second, Patterns: map[events.Pattern]int{events.PatternRapidFire: 1, events.PatternBotLike: 1}}, sc)
	require.False(t, r.Families[0].Abusive, "legitimate families first")
	require.Equal(t, []PatternResult{
		{Pattern: events.PatternDistributedIP, Principals: 2, Penalized: 1, AsExpected: 2, LatP50: 10 * time.Second, LatP99: 10 * time.Second},
		{Pattern: events.PatternRapidFire, Principals: 2, Penalized: 1, AsExpected: 1, LatP50: time.Second, LatP99: time.Second},
	}, r.Patterns)
}

// TestRunThroughBroker runs a small held-out stream through one real
// detector process on the local broker and Redis, and checks the instrument
// sees every principal and reads detections and penalties back. Cold blasts
// (100–500 req/s from a new principal) are caught as a family; a declared bot
// among them running just past its limit (a third denied or less) is the
// limiter's business under the kind-aware model, so not every one need be.
func TestRunThroughBroker(t *testing.T) {
	stacktest.Needs(t, "needs the local stack (broker, Redis)")
	dir := t.TempDir()
	bin := filepath.Join(dir, "detector")
	b := exec.Command("go", "build", "-o", bin, "github.com/floodgate-dev/floodgate/services/detector")
	b.Stderr = os.Stderr
	require.NoError(t, b.Run())
	cfg := Config{Brokers: []string{"127.0.0.1:9092"}, RedisAddrs: []string{"127.0.0.1:6379"}, DetectorBin: bin, Instances: []int{1},
		Seed: uint64(time.Now().UnixNano()), Legit: 1000, Abusive: 20, Duration: 2 * time.Minute, Partitions: 12,
		DrainTimeout: 2 * time.Minute, LogDir: dir, Log: slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelWarn}))}
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	rep, err := Run(ctx, cfg)
	require.NoError(t, err)
	require.Len(t, rep.Results, 1)
	r := rep.Results[0]
	require.Equal(t, 1000, r.Legit)
	require.Equal(t, 20, r.Abusive)
	require.Greater(t, r.Events, 10_000)
	for _, f := range r.Families {
		if f.Name == "cold_blast" {
			require.Positive(t, f.Penalized, "cold blasts penalized")
			require.LessOrEqual(t, f.Penalized, f.Principals)
			require.Greater(t, f.LatP50, time.Duration(0))
		}
	}
	var out bytes.Buffer
	require.NoError(t, rep.WriteText(&out))
	require.Contains(t, out.String(), "legitimate principals penalized")
	require.Contains(t, out.String(), "legit refused by a penalty")
	require.Len(t, r.Harm.Families, len(r.Families), "harm lists every family")
}

// TestMeasureHarm: a legitimate principal under a penalty of ×0.01 for the
// whole run is refused requests it was admitted without one, and the count
// is exact against a replay by hand; an abuser under a penalty is admitted
// at most its penalized allowance after detection.
func TestMeasureHarm(t *testing.T) {
	h := labeled.HeldOut{Seed: 9, Start: time.Date(2026, 11, 29, 6, 0, 0, 0, time.UTC), Duration: 2 * time.Minute, Legit: 400, Abusive: 20}
	src, err := labeled.NewHeldOut(h)
	require.NoError(t, err)
	labels := src.Labels()
	// The busiest legitimate principal and the busiest abuser.
	count := map[string]int{}
	var d events.Decision
	for src.Next(&d) {
		count[d.Principal.Key()]++
	}
	var legit, abuser string
	for k, l := range labels {
		if l.Abusive && l.Pattern == events.PatternRapidFire && (abuser == "" || count[k] > count[abuser]) {
			abuser = k
		}
		if !l.Abusive && (legit == "" || count[k] > count[legit]) {
			legit = k
		}
	}
	end := h.Start.Add(h.Duration + time.Minute)
	all := map[string][]events.Abuse{
		legit:  {{DetectedAt: h.Start, Penalty: events.Penalty{Multiplier: 0.01, ExpiresAt: end, Mode: events.PenaltyEnforced}}},
		abuser: {{DetectedAt: labels[abuser].AbuseStart.Add(time.Second), Penalty: events.Penalty{Multiplier: 0.1, ExpiresAt: end, Mode: events.PenaltyEnforced}}},
	}
	src, err = labeled.NewHeldOut(h)
	require.NoError(t, err)
	got := MeasureHarm(src, src.Labels(), all, 0)
	fams := map[string]FamilyHarm{}
	for _, f := range got.Families {
		fams[f.Name] = f
	}
	require.Len(t, fams, len(labeled.Families()), "every family listed")
	lf, af := fams[labels[legit].Family], fams[labels[abuser].Family]
	require.Equal(t, 1, lf.Principals)
	require.Positive(t, lf.Refused, "a ×0.01 penalty refuses the busiest person's calls")
	require.LessOrEqual(t, lf.Refused, lf.Requests)
	require.Equal(t, 1, af.Principals)
	require.Positive(t, af.AdmittedAfter)
	require.LessOrEqual(t, af.Ratio(), 1.2, "admitted %d of an allowance of %.1f", af.AdmittedAfter, af.Allowance)
	for name, f := range fams {
		if name != lf.Name && name != af.Name {
			require.Zero(t, f.Principals+int(f.Refused+f.AdmittedAfter), name)
		}
	}
}
