package score

import (
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// TestHeldOutInProcess scores the held-out stream (loadtest/labeled: the
// people families modelled from real clients, automation, and today's abuse
// families) with 12 partition scorers sharing one IP store, as the quality
// run's detectors do without the broker, and requires no legitimate
// principal penalized and every abusive family at ≥ 99.5 % recall.
// FLOODGATE_HELDOUT_LEGIT and FLOODGATE_HELDOUT_SEED size it (the quality
// run, loadtest/cmd/quality, is the full measurement):
//
//	FLOODGATE_HELDOUT_LEGIT=100000 FLOODGATE_HELDOUT_SEED=202 go test ./services/detector/internal/score -run TestHeldOutInProcess -v
func TestHeldOutInProcess(t *testing.T) {
	legit, seed := 3000, uint64(time.Now().UnixNano())
	if v := os.Getenv("FLOODGATE_HELDOUT_LEGIT"); v != "" {
		n, err := strconv.Atoi(v)
		require.NoError(t, err, "FLOODGATE_HELDOUT_LEGIT")
		legit = n
	}
	if v := os.Getenv("FLOODGATE_HELDOUT_SEED"); v != "" {
		n, err := strconv.ParseUint(v, 10, 64)
		require.NoError(t, err, "FLOODGATE_HELDOUT_SEED")
		seed = n
	}
	start := t0
	if v := os.Getenv("FLOODGATE_HELDOUT_START"); v != "" { // a quality run's start, to replay its stream
		var err error
		start, err = time.Parse(time.RFC3339, v)
		require.NoError(t, err, "FLOODGATE_HELDOUT_START")
	}
	t.Logf("seed %d, %d legitimate principals, from %s", seed, legit, start.Format(time.RFC3339))
	stream, err := labeled.NewHeldOut(labeled.HeldOut{Seed: seed, Start: start, Duration: 4 * time.Minute, Legit: legit, Abusive: max(legit/100, 200), Prefix: "h_"})
	require.NoError(t, err)
	cfg := DefaultConfig()
	ips := NewIPStore(cfg)
	var scorers [12]*Scorer
	for i := range scorers {
		scorers[i] = New(cfg, ips)
	}
	first := map[string]Detection{}
	var d events.Decision
	var out []Detection
	n := 0
	for stream.Next(&d) {
		n++
		out = scorers[fnv(d.Principal.Key())%12].Observe(&d, out[:0])
		for _, det := range out {
			if _, ok := first[det.Principal.Key()]; !ok && det.Penalize {
				first[det.Principal.Key()] = det
			}
		}
	}
	type family struct {
		abusive          bool
		principals, hits int
		lat              []time.Duration
	}
	fams := map[string]*family{}
	for k, l := range stream.Labels() {
		f := fams[l.Family]
		if f == nil {
			f = &family{abusive: l.Abusive}
			fams[l.Family] = f
		}
		f.principals++
		det, ok := first[k]
		if !ok {
			if l.Abusive {
				t.Logf("missed %s (%s), abuse from %s", k, l.Family, l.AbuseStart.Format(time.RFC3339Nano))
			}
			continue
		}
		f.hits++
		if l.Abusive {
			f.lat = append(f.lat, det.At.Sub(l.AbuseStart))
		} else {
			t.Errorf("legitimate %s (%s) penalized: %s on %s, score %.2f against %.2f (%s), %d denials (%.0f %%), held %s",
				k, l.Family, det.Pattern, det.Route, det.Score, det.Threshold, det.BaselineSource, det.Denials, 100*det.DenialRatio, det.Sustained)
		}
	}
	names := make([]string, 0, len(fams))
	for name := range fams {
		names = append(names, name)
	}
	sort.Strings(names)
	t.Logf("%d events; %-20s %-8s %10s %10s %8s %8s", n, "family", "class", "principals", "penalized", "p50", "p99")
	for _, name := range names {
		f := fams[name]
		class := "legit"
		if f.abusive {
			class = "abusive"
			require.GreaterOrEqual(t, float64(f.hits), 0.995*float64(f.principals), "recall of %s", name)
		}
		t.Logf("%-20s %-8s %10d %10d %8s %8s", name, class, f.principals, f.hits, pct(f.lat, 0.5), pct(f.lat, 0.99))
	}
}
