package tuning

import (
	"fmt"
	"net/netip"
	"sort"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// Routes of the route-family recording.
const (
	routeUpload = "/v1/uploads/{upload_id}/parts"
	routeSearch = "/v1/search"
	routeItem   = "/v1/items/{item_id}"
)

// routeRecording is two minutes of API keys: 300 steady callers on every
// route at about one request a second; 12 integrations (family "uploader",
// legitimate) that upload a file in parts — 30 requests a second on the
// upload route for 20 s, most of them denied by their limit; and 20 scrapers
// (abusive) hitting the search and item routes exactly as hard. One
// pattern, one kind: nothing in a kind's parameters tells an upload from a
// scrape, only the route does. It returns the decisions in time order and
// whether each principal is abusive.
func routeRecording(start time.Time) ([]events.Decision, map[string]string) {
	family := map[string]string{}
	var ds []events.Decision
	add := func(p events.Principal, at time.Time, route string, allowed bool, ip string) {
		tier := events.TierPrincipal
		ds = append(ds, events.Decision{ID: fmt.Sprintf("d%d", len(ds)), TS: at, Principal: p, IP: netip.MustParseAddr(ip), Method: "POST",
			Route: route, Allowed: allowed, Tier: tier, Cost: 1, Limit: 10, Remaining: 0, Gateway: "gw1"})
	}
	routes := []string{routeUpload, routeSearch, routeItem}
	for i := range 300 {
		p := events.Principal{Kind: events.PrincipalAPIKey, ID: fmt.Sprintf("steady%03d", i)}
		family[p.Key()] = "steady"
		ip := fmt.Sprintf("10.1.%d.%d", i/200, i%200+1)
		for s := 0; s < 120; s++ {
			for j, r := range routes {
				add(p, start.Add(time.Duration(s)*time.Second+time.Duration(i*7+j*331)%1000*time.Millisecond), r, true, ip)
			}
		}
	}
	burst := func(name, fam string, n int, route string) {
		for i := range n {
			p := events.Principal{Kind: events.PrincipalAPIKey, ID: fmt.Sprintf("%s%02d", name, i)}
			family[p.Key()] = fam
			ip := fmt.Sprintf("10.2.%d.%d", len(family)/200, len(family)%200+1)
			off := time.Duration(i*13) * time.Millisecond
			for s := 0; s < 120; s++ {
				for _, r := range routes {
					if r != route {
						add(p, start.Add(time.Duration(s)*time.Second+off), r, true, ip)
					}
				}
			}
			// Steady at 4/s on its own route, then 15/s for 20 s with
			// four requests in five refused.
			from := start.Add(time.Duration(40+i) * time.Second)
			for k := 0; k < 4*120; k++ {
				if at := start.Add(time.Duration(k)*time.Second/4 + off); at.Before(from) || !at.Before(from.Add(20*time.Second)) {
					add(p, at, route, true, ip)
				}
			}
			for k := 0; k < 20*15; k++ {
				add(p, from.Add(time.Duration(k)*time.Second/15), route, k%5 == 0, ip)
			}
		}
	}
	burst("uploader", "uploader", 12, routeUpload)
	burst("scraper", "scraper", 20, routeSearch)
	sort.SliceStable(ds, func(i, j int) bool { return ds[i].TS.Before(ds[j].TS) })
	return ds, family
}

// TestRouteProposalFromTenFalsePositivesOfOneFamily: the uploaders' false
// positives are all on the upload route; from ten of their verdicts (and
// the confirmed ones) Propose builds an override of api_key on that route,
// which on replay avoids at least 90 % of the family's false positives and
// keeps at least 99.5 % of the confirmed detections — where no override of
// the kind alone can (the scrapers look the same on their routes).
func TestRouteProposalFromTenFalsePositivesOfOneFamily(t *testing.T) {
	ds, family := routeRecording(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	base := score.DefaultConfig()
	dets := Detections(ds, base, nil)
	judged := map[string]Judged{}
	var fpKeys []string
	for k, d := range dets {
		v := events.VerdictConfirmed
		if family[k] != "scraper" {
			v = events.VerdictFalsePositive
			fpKeys = append(fpKeys, k)
		}
		judged[k] = Judged{Detection: d, Verdict: v}
	}
	sort.Strings(fpKeys)
	require.Len(t, fpKeys, 12, "every uploader is a false positive of the default parameters")
	var vs []Verdicted
	for _, k := range fpKeys[:10] {
		require.Equal(t, "uploader", family[k])
		vs = append(vs, Verdicted{Principal: k, Verdict: events.VerdictFalsePositive})
	}
	for k, j := range judged {
		if j.Verdict == events.VerdictConfirmed {
			vs = append(vs, Verdicted{Principal: k, Verdict: j.Verdict})
		}
	}
	targets := Targets{MinClassAvoided: 0.9, MinKept: 0.995}
	built, err := Propose(ds, base, score.Params{}, vs, 10, targets)
	require.NoError(t, err)
	require.Len(t, built, 1)
	b := built[0]
	e := b.Evaluation
	t.Logf("%d decisions; %s: %s — confirmed kept %d/%d, family false positives avoided %d/%d, new detections %d",
		len(ds), b.Proposal.Class, b.Proposal, e.ConfirmedKept, e.Confirmed, e.ClassFPAvoided, e.ClassFPs, e.NewDetections)
	require.Equal(t, Class{Pattern: events.PatternRapidFire, Kind: events.PrincipalAPIKey, Route: routeUpload}, b.Proposal.Class)
	require.True(t, b.Meets)
	require.Len(t, b.Proposal.Params.Overrides, 1)
	require.Equal(t, score.Override{Kind: events.PrincipalAPIKey, Route: routeUpload, Knobs: b.Proposal.Params.Overrides[0].Knobs}, b.Proposal.Params.Overrides[0])
	require.Equal(t, 10, e.ClassFPs, "the family's false positives judged (two uploaders were not)")

	// The whole family, judged or not, and every confirmed detection.
	got := Detections(ds, base, b.Proposal.Tuned)
	var fam, avoided, conf, kept int
	for k := range dets {
		_, still := got[k]
		if family[k] == "scraper" {
			conf++
			if still {
				kept++
			}
			continue
		}
		fam++
		if !still {
			avoided++
		}
	}
	t.Logf("replayed: uploader false positives avoided %d/%d, confirmed kept %d/%d", avoided, fam, kept, conf)
	require.GreaterOrEqual(t, float64(avoided), 0.9*float64(fam))
	require.GreaterOrEqual(t, float64(kept), 0.995*float64(conf))

	// The kind alone cannot tell them apart, however far it moves.
	var fps []score.Detection
	for _, k := range fpKeys[:10] {
		fps = append(fps, dets[k])
	}
	kind := Class{Pattern: events.PatternRapidFire, Kind: events.PrincipalAPIKey}
	further := func(p Proposal, round int) (Proposal, bool) { return further(base, score.Params{}, p, round) }
	for _, p := range best(ds, base, Candidates(base, score.Params{}, kind, fps), judged, targets, further) {
		t.Logf("kind-wide %s: confirmed kept %d/%d, family false positives avoided %d/%d", p.Proposal, p.Evaluation.ConfirmedKept, p.Evaluation.Confirmed,
			p.Evaluation.ClassFPAvoided, p.Evaluation.ClassFPs)
		require.False(t, p.Meets, "no kind-wide override meets the targets here")
	}
}

func TestConcentratedRoute(t *testing.T) {
	d := func(route string) score.Detection { return score.Detection{Route: route} }
	for _, tc := range []struct {
		name string
		fps  []score.Detection
		want string
	}{
		{"all on one route", []score.Detection{d("/a"), d("/a"), d("/a")}, "/a"},
		{"nine in ten", []score.Detection{d("/a"), d("/a"), d("/a"), d("/a"), d("/a"), d("/a"), d("/a"), d("/a"), d("/a"), d("/b")}, "/a"},
		{"split", []score.Detection{d("/a"), d("/a"), d("/b")}, ""},
		{"a person's all-route window is no route", []score.Detection{d(score.AllRoutes), d(score.AllRoutes)}, ""},
	} {
		t.Run(tc.name, func(t *testing.T) { require.Equal(t, tc.want, concentrated(tc.fps, 0.9)) })
	}
}

func TestFurtherMovesEachParameterFurther(t *testing.T) {
	for _, tc := range []struct {
		ch   Change
		f    float64
		want string
	}{
		{Change{"rapid_fire_rate", "2", "2.121"}, 4, "2.484"},
		{Change{"rapid_fire_threshold", "5", "5.5"}, 16, "13"},
		{Change{"automated_denial_ratio", "0.5", "0.7322"}, 4, "0.99"},
		{Change{"person_min_denials", "20", "31"}, 4, "64"},
		{Change{"person_sustain", "1s", "3s"}, 4, "9s"},
		{Change{"person_sustain", "1s", "1.5s"}, 1, "2s"},
	} {
		t.Run(tc.ch.Param+" "+tc.want, func(t *testing.T) {
			got, ok := stretch(tc.ch, tc.f)
			require.True(t, ok)
			require.Equal(t, tc.want, got)
		})
	}
}

// TestThresholdMovesPastAutomationsRate: for automation the threshold
// candidate is moved past the rate over the floor each false positive
// reached (automation's score is measured against its limit, and the
// threshold decides only whether its rate counts), and moved further it
// avoids them on replay.
func TestThresholdMovesPastAutomationsRate(t *testing.T) {
	ds, family := routeRecording(time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC))
	base := score.DefaultConfig()
	dets := Detections(ds, base, nil)
	var fps []score.Detection
	for k, d := range dets {
		if family[k] == "uploader" {
			fps = append(fps, d)
		}
	}
	require.NotEmpty(t, fps)
	c := Class{Pattern: events.PatternRapidFire, Kind: events.PrincipalAPIKey, Route: routeUpload}
	var threshold Proposal
	for _, p := range Candidates(base, score.Params{}, c, fps) {
		if len(p.Changes) == 1 && p.Changes[0].Param == "rapid_fire_threshold" {
			threshold = p
		}
	}
	require.NotNil(t, threshold.Tuned, "a threshold candidate for the class")
	k := threshold.Tuned.Config(c.Kind, c.Route)
	for _, d := range fps {
		require.Greater(t, k.Floor*k.Threshold, d.ObservedRate, "%s: %s leaves its rate over the line", d.Principal.Key(), threshold)
	}
	avoidsAll := func(p Proposal) bool {
		got := Detections(ds, base, p.Tuned)
		for _, d := range fps {
			if _, still := got[d.Principal.Key()]; still {
				return false
			}
		}
		return true
	}
	avoided := avoidsAll(threshold)
	for round := 1; round <= 3 && !avoided; round++ {
		p, ok := further(base, score.Params{}, threshold, round)
		require.True(t, ok)
		avoided = avoidsAll(p)
	}
	require.True(t, avoided, "the threshold, moved further, avoids the false positives")
}
