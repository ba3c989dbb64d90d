package score

import (
	"fmt"
	hashfnv "hash/fnv"
	"os"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

// TestLabeledTraffic feeds the labeled scenarios through 12 partition scorers
// (partitioned by principal, as the decisions topic is) sharing one IP store,
// and checks recall, false positives and latency. FLOODGATE_LABELED_SCALE
// sizes the run (default 0.1 → 10,000 normal users); the report in
// docs/detector.md uses scale 1:
//
//	FLOODGATE_LABELED_SCALE=1 go test ./services/detector/internal/score -run TestLabeledTraffic -v -count=1
func TestLabeledTraffic(t *testing.T) {
	scale := 0.1
	if v := os.Getenv("FLOODGATE_LABELED_SCALE"); v != "" {
		var err error
		scale, err = strconv.ParseFloat(v, 64)
		require.NoError(t, err, "FLOODGATE_LABELED_SCALE")
	}
	stream := labeled.New(labeled.Default(scale))
	cfg := DefaultConfig()
	ips := NewIPStore(cfg)
	const partitions = 12
	var scorers [partitions]*Scorer
	for i := range scorers {
		scorers[i] = New(cfg, ips)
	}
	first := map[string]Detection{}
	byPattern := map[events.Pattern]map[string]bool{}
	var d events.Decision
	var out []Detection
	n := 0
	began := time.Now()
	for stream.Next(&d) {
		n++
		s := scorers[int(fnv(d.Principal.Key())%partitions)]
		out = s.Observe(&d, out[:0])
		for _, det := range out {
			k := det.Principal.Key()
			if _, ok := first[k]; !ok {
				first[k] = det
			}
			if byPattern[det.Pattern] == nil {
				byPattern[det.Pattern] = map[string]bool{}
			}
			byPattern[det.Pattern][k] = true
		}
	}
	elapsed := time.Since(began)

	type tally struct {
		principals, detected int
		latencies            []time.Duration
	}
	pops := map[string]*tally{}
	var abusive, caught, legit, fps int
	var lat []time.Duration
	var fpList []string
	for k, l := range stream.Labels() {
		tl := pops[l.Population]
		if tl == nil {
			tl = &tally{}
			pops[l.Population] = tl
		}
		tl.principals++
		det, hit := first[k]
		if hit {
			tl.detected++
		}
		if l.Abusive {
			abusive++
			if hit {
				caught++
				tl.latencies = append(tl.latencies, det.At.Sub(l.AbuseStart))
				lat = append(lat, det.At.Sub(l.AbuseStart))
			}
		} else {
			legit++
			if hit {
				fps++
				fpList = append(fpList, fmt.Sprintf("%s (%s, score %.2f)", k, det.Pattern, det.Score))
			}
		}
	}
	names := make([]string, 0, len(pops))
	for p := range pops {
		names = append(names, p)
	}
	sort.Strings(names)
	t.Logf("labeled traffic: %d events, %d principals, scored in %s (%.0f events/s, 12 partitions on one goroutine)", n, len(stream.Labels()), elapsed.Round(time.Millisecond), float64(n)/elapsed.Seconds())
	t.Logf("%-16s %10s %9s %12s %12s", "population", "principals", "detected", "p50 latency", "p99 latency")
	for _, p := range names {
		tl := pops[p]
		t.Logf("%-16s %10d %9d %12s %12s", p, tl.principals, tl.detected, pct(tl.latencies, 0.5), pct(tl.latencies, 0.99))
	}
	recall := float64(caught) / float64(abusive)
	fpr := float64(fps) / float64(legit)
	t.Logf("recall %.4f%% (%d/%d), false-positive rate %.5f%% (%d/%d), latency from abuse start p50 %s p99 %s",
		100*recall, caught, abusive, 100*fpr, fps, legit, pct(lat, 0.5), pct(lat, 0.99))
	for p, m := range byPattern {
		t.Logf("pattern %-15s %d principals", p, len(m))
	}
	if len(fpList) > 0 {
		t.Logf("false positives: %v", fpList[:min(len(fpList), 20)])
	}
	require.GreaterOrEqual(t, recall, 0.995, "recall")
	require.LessOrEqual(t, fpr, 0.00001+1/float64(legit), "false-positive rate (at this scale one false positive is the resolution)")
}

func pct(ds []time.Duration, q float64) string {
	if len(ds) == 0 {
		return "-"
	}
	s := append([]time.Duration(nil), ds...)
	sort.Slice(s, func(i, j int) bool { return s[i] < s[j] })
	return s[min(len(s)-1, int(q*float64(len(s))))].Round(10 * time.Millisecond).String()
}

// fnv is FNV-1a (32-bit) of s.
func fnv(s string) uint32 {
	h := hashfnv.New32a()
	_, _ = h.Write([]byte(s))
	return h.Sum32()
}
