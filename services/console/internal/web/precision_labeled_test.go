package web

import (
	"context"
	"encoding/json"
	"net/http"
	"net/netip"
	"sort"
	"strconv"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// seedDetection writes an abuse record for p as the detector does, with one
// top address (shared by `shared` other principals) and one top route.
func (e *testEnv) seedDetection(t *testing.T, p events.Principal, n int, at time.Time, pattern events.Pattern, ip string, shared int64, route string) store.Alert {
	t.Helper()
	a := events.Abuse{ID: "ab_" + e.run + "_" + strconv.Itoa(n), DetectedAt: at, Principal: p, Pattern: pattern, Severity: events.SeverityHigh, Score: 9,
		Window: events.Window{Start: at.Add(-10 * time.Second), End: at, Seconds: 10}, FirstEventAt: at.Add(-10 * time.Second),
		Evidence: events.Evidence{ObservedRate: 50, BaselineRate: 2, Threshold: 10, EventCount: 500, DistinctIPs: 1, DistinctIP24: 1,
			TopRoutes: []events.RouteCount{{Route: route, Count: 500}},
			TopIPs:    []events.IPCount{{IP: netip.MustParseAddr(ip), Count: 500, SharedPrincipals: shared}}},
		Penalty:         events.Penalty{Multiplier: 0.5, ExpiresAt: at.Add(10 * time.Minute), Level: 1, Mode: events.PenaltyEnforced},
		DetectorVersion: "detector-labeled",
	}
	body, err := events.EncodeAbuse(&a)
	require.NoError(t, err)
	ts := at.UTC().Format("2006-01-02T15:04:05.000Z")
	_, err = e.ddb.PutItem(context.Background(), &dynamodb.PutItemInput{TableName: aws.String(e.prefix + dynamo.TableAbuseRecords), Item: map[string]types.AttributeValue{
		"pk": s(p.Key()), "sk": s(ts + "#" + a.ID), "gsi1pk": s("day#" + at.UTC().Format("2006-01-02")), "gsi1sk": s(ts),
		"id": s(a.ID), "pattern": s(string(pattern)), "severity": s("high"), "mode": s("enforced"),
		"penalty_until": s(a.Penalty.ExpiresAt.UTC().Format(time.RFC3339)), "detector_version": s(a.DetectorVersion), "event": s(string(body)),
	}})
	require.NoError(t, err)
	return store.Alert{Principal: p.Key(), SK: ts + "#" + a.ID}
}

// TestPrecisionOfLabeledVerdicts: detections of held-out labeled principals
// (every abusive family with its expected pattern, and people and NAT'd
// families detected by mistake) get the verdicts a reviewer would give
// from the labels; the precision the console computes from what it stored,
// by pattern and by kind, equals the labels' within 1 % (it is exact: the
// same counts).
func TestPrecisionOfLabeledVerdicts(t *testing.T) {
	stacktest.Needs(t, "needs Redis and DynamoDB Local")
	e, _ := newVerdictEnv(t)
	stream, err := labeled.NewHeldOut(labeled.HeldOut{Seed: 11, Start: time.Date(2026, 11, 22, 10, 0, 0, 0, time.UTC), Duration: 2 * time.Minute,
		Legit: 300, Abusive: 60, Prefix: e.run + "_"})
	require.NoError(t, err)
	keys := make([]string, 0, len(stream.Labels()))
	for k := range stream.Labels() {
		keys = append(keys, k)
	}
	sort.Strings(keys)

	type want struct{ confirmed, fp int }
	byPattern, byKind := map[string]*want{}, map[string]*want{}
	count := func(m map[string]*want, k string, abusive bool) {
		if m[k] == nil {
			m[k] = &want{}
		}
		if abusive {
			m[k].confirmed++
		} else {
			m[k].fp++
		}
	}
	// What a detector mistook: people bursting from one device (rapid_fire
	// on their own address) and NAT'd users (distributed_ip behind a shared one).
	mistaken := map[string]events.Pattern{"multi_device": events.PatternRapidFire, "reconnect_storm": events.PatternRapidFire, "cgnat": events.PatternDistributedIP}
	taken := map[string]int{}
	at := time.Now().Add(-time.Hour)
	n := 0
	for _, k := range keys {
		l := stream.Labels()[k]
		pattern := l.Pattern
		ip, shared := "203.0.113.9", int64(0)
		if !l.Abusive {
			var ok bool
			if pattern, ok = mistaken[l.Family]; !ok || taken[l.Family] >= 4 {
				continue
			}
			taken[l.Family]++
			if pattern == events.PatternDistributedIP {
				ip, shared = "198.51.100.1", 12
			}
		}
		n++
		a := e.seedDetection(t, l.Principal, n, at.Add(time.Duration(n)*time.Second), pattern, ip, shared, "/v1/items/{id}")
		verdict := "confirmed"
		if !l.Abusive {
			verdict = "false_positive"
		}
		code, body := e.postVerdict(t, "analyst", map[string]string{"principal": a.Principal, "key": a.SK, "verdict": verdict,
			"reason": "labeled " + l.Family, "allowlist_for": "1d"})
		require.Equal(t, http.StatusOK, code, body)
		count(byPattern, string(pattern), l.Abusive)
		count(byKind, string(l.Principal.Kind), l.Abusive)
	}
	require.Equal(t, 4, taken["multi_device"])
	require.Equal(t, 4, taken["cgnat"])

	check := func(by string, wants map[string]*want) {
		t.Helper()
		req, err := http.NewRequest(http.MethodGet, e.srv.URL+"/api/v1/precision?by="+by+"&days=2", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+e.tokens["viewer"])
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		require.Equal(t, http.StatusOK, res.StatusCode)
		var out struct {
			Rows []struct {
				Value string `json:"value"`
				Total struct {
					Confirmed     int      `json:"confirmed"`
					FalsePositive int      `json:"false_positive"`
					Precision     *float64 `json:"precision"`
				} `json:"total"`
			} `json:"rows"`
		}
		require.NoError(t, json.NewDecoder(res.Body).Decode(&out))
		require.Len(t, out.Rows, len(wants), by)
		for _, r := range out.Rows {
			w := wants[r.Value]
			require.NotNil(t, w, "%s %q", by, r.Value)
			labeledPrecision := float64(w.confirmed) / float64(w.confirmed+w.fp)
			require.NotNil(t, r.Total.Precision)
			require.InDelta(t, labeledPrecision, *r.Total.Precision, 0.01, "%s %s", by, r.Value)
			require.Equal(t, w.confirmed, r.Total.Confirmed)
			require.Equal(t, w.fp, r.Total.FalsePositive)
			t.Logf("%s %-16s console %.4f labels %.4f (%d confirmed, %d false positives)", by, r.Value, *r.Total.Precision, labeledPrecision, w.confirmed, w.fp)
		}
	}
	check("pattern", byPattern)
	check("kind", byKind)

	// The network classes the verdicts stored: the NAT'd users' detections are shared_address.
	js, err := e.st.Judged(context.Background(), at.Add(-time.Minute), time.Now())
	require.NoError(t, err)
	shared := 0
	for _, j := range js {
		if j.Network == "shared_address" {
			shared++
		}
	}
	require.Equal(t, 4, shared)
}
