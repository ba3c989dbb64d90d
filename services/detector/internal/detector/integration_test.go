package detector

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net/netip"
	"sync"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/redis/go-redis/v9"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
)

// dynamoRecords creates the detector's tables under a unique prefix in
// DynamoDB Local (FLOODGATE_DYNAMODB_ENDPOINT) and drops them afterwards.
func dynamoRecords(t *testing.T) *DynamoRecords {
	t.Helper()
	ddb, prefix := migrationstest.DynamoTables(t, "det", dynamo.TableAbuseRecords, dynamo.TableRuntimeConfig)
	return &DynamoRecords{Client: ddb, AbuseTable: prefix + dynamo.TableAbuseRecords, RuntimeTable: prefix + dynamo.TableRuntimeConfig, Retention: 90 * 24 * time.Hour}
}

// botBurst sends a rapid-fire burst for p starting at start through d and
// returns how many events it took to detect.
func botBurst(t *testing.T, d *Detector, p events.Principal, start time.Time, ip string) {
	t.Helper()
	for i := 0; i < 2000; i++ {
		ev := decision(p, start.Add(time.Duration(i)*5*time.Millisecond), ip, "/a")
		ev.ID = fmt.Sprintf("e%d", i)
		require.NoError(t, d.Handle(context.Background(), kafka.Message{Topic: "floodgate.decisions.v1", Partition: 1, Offset: int64(i), Value: encodeDecision(t, ev)}))
	}
}

func TestDetectorRecordsEscalatesAndIsIdempotent(t *testing.T) {
	stacktest.Needs(t, "needs the local stack: `make test` runs it (`make test-unit` is -short, no stack)")
	records := dynamoRecords(t)
	pub := &flakyPublisher{}
	d := newTestDetector(t, pub, func(c *Config) { c.Records = records })
	ctx := context.Background()
	bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "esc")}
	now := time.Now().UTC().Truncate(time.Second)

	botBurst(t, d, bot, now.Add(-3*time.Hour), "203.0.113.9")
	botBurst(t, d, bot, now.Add(-3*time.Hour+5*time.Minute), "203.0.113.9")
	botBurst(t, d, bot, now.Add(-5*time.Minute), "203.0.113.9")
	require.Len(t, pub.msgs, 3, "three detections, cool-downs apart")
	var all []events.Abuse
	for _, m := range pub.msgs {
		a, err := events.DecodeAbuse(m.Value)
		require.NoError(t, err)
		all = append(all, a)
	}
	require.Equal(t, int64(1), all[0].Penalty.Level)
	basis := all[0].Evidence.Basis
	require.NotNil(t, basis, "the evidence says what the bot was measured against")
	require.Equal(t, events.BasisLimit, basis.Source, "automation is measured against its limit")
	require.Equal(t, events.PrincipalBot, basis.BaselineKind)
	require.GreaterOrEqual(t, basis.DenialRatio, 0.5)
	require.Greater(t, all[0].Score, 2.0, "its rate against what the limiter let through")
	require.Equal(t, int64(1), all[1].Penalty.Level, "a re-detection while the penalty runs is the same incident: no escalation")
	require.True(t, all[1].Penalty.ExpiresAt.After(all[1].DetectedAt.Add(50*time.Minute)),
		"it carries a penalty from its own time, which extends the incident's (the penalty store keeps the later expiry)")
	require.NotEmpty(t, all[0].IncidentID)
	require.Equal(t, all[0].IncidentID, all[1].IncidentID, "one incident")
	require.Equal(t, []int64{1, 2}, []int64{all[0].DetectionCount, all[1].DetectionCount})
	require.NotEqual(t, all[0].IncidentID, all[2].IncidentID, "a new incident after the quiet period")
	require.Equal(t, int64(1), all[2].DetectionCount)
	got := []events.Abuse{all[0], all[2]}
	require.Equal(t, int64(2), got[1].Penalty.Level, "a repeat offender escalates: a new incident after the first was over")
	// Each names the message that crossed the threshold: the burst's event i
	// is at offset i and at start + 5 ms × i, and the detection's time is the
	// crossing event's time.
	for i, start := range []time.Time{now.Add(-3 * time.Hour), now.Add(-5 * time.Minute)} {
		ref := got[i].Evidence.CrossingEvent
		require.NotNil(t, ref, "detection %d names its crossing event", i)
		require.Equal(t, "floodgate.decisions.v1", ref.Topic)
		require.Equal(t, int32(1), ref.Partition)
		require.Positive(t, ref.Offset, "a burst crosses after some events, not on its first")
		require.Equal(t, start.Add(time.Duration(ref.Offset)*5*time.Millisecond), got[i].DetectedAt, "offset %d is the crossing event", ref.Offset)
	}
	ttl1 := got[0].Penalty.ExpiresAt.Sub(got[0].DetectedAt)
	ttl2 := got[1].Penalty.ExpiresAt.Sub(got[1].DetectedAt)
	require.InDelta(t, float64(time.Hour), float64(ttl1), float64(6*time.Minute)+1, "base TTL ±10%% jitter")
	require.InDelta(t, float64(2*time.Hour), float64(ttl2), float64(12*time.Minute)+1, "doubled ±10%% jitter")

	// The stored record: one per detection, IPs truncated, day index filled.
	out, err := records.Client.Query(ctx, &dynamodb.QueryInput{TableName: aws.String(records.AbuseTable),
		KeyConditionExpression:    aws.String("pk = :pk"),
		ExpressionAttributeValues: map[string]types.AttributeValue{":pk": &types.AttributeValueMemberS{Value: bot.Key()}}})
	require.NoError(t, err)
	require.Len(t, out.Items, 3)
	stored, err := events.DecodeAbuse([]byte(dynamo.Str(out.Items[0]["event"])))
	require.NoError(t, err)
	require.Equal(t, netip.MustParseAddr("203.0.113.0"), stored.Evidence.TopIPs[0].IP, "truncated to the /24")
	require.NotNil(t, stored.Evidence.CrossingEvent, "the record keeps where the crossing event was read (the console reads samples from there)")
	require.Equal(t, "day#"+got[0].DetectedAt.Format("2006-01-02"), dynamo.Str(out.Items[0]["gsi1pk"]))

	// Replaying the second detection: same id, same level, same penalty, no new record.
	require.NoError(t, records.Put(ctx, &got[1]))
	n, err := records.PriorIncidents(ctx, bot, got[1].DetectedAt, 24*time.Hour, 10*time.Minute, got[1].ID)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	fresh := newTestDetector(t, &flakyPublisher{}, func(c *Config) { c.Records = records })
	replay := &flakyPublisher{}
	fresh.cfg.Publisher = replay
	botBurst(t, fresh, bot, now.Add(-5*time.Minute), "203.0.113.9")
	require.Len(t, replay.msgs, 1)
	again, err := events.DecodeAbuse(replay.msgs[0].Value)
	require.NoError(t, err)
	require.Equal(t, got[1].ID, again.ID)
	require.Equal(t, got[1].Penalty, again.Penalty, "replays are idempotent: same level, same jittered expiry")
}

func TestDetectorAllowlist(t *testing.T) {
	stacktest.Needs(t, "needs the local stack: `make test` runs it (`make test-unit` is -short, no stack)")
	records := dynamoRecords(t)
	ctx := context.Background()
	allowedBot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "allowed")}
	require.NoError(t, records.PutAllow(ctx, AllowEntry{Principal: allowedBot.Key(), ExpiresAt: time.Now().Add(time.Hour), Comment: "load test of a partner", CreatedBy: "alice"}))
	require.NoError(t, records.PutAllow(ctx, AllowEntry{CIDR: netip.MustParsePrefix("192.0.2.0/24"), ExpiresAt: time.Now().Add(time.Hour), Comment: "office", CreatedBy: "bob"}))
	require.NoError(t, records.PutAllow(ctx, AllowEntry{CIDR: netip.MustParsePrefix("198.18.0.0/15"), ExpiresAt: time.Now().Add(-time.Hour), Comment: "expired", CreatedBy: "bob"}))
	entries, err := records.LoadAllowlist(ctx, time.Now())
	require.NoError(t, err)
	require.Len(t, entries, 2, "the expired entry is not loaded")
	allow := &Allowlist{}
	allow.Set(entries)

	cases := []struct {
		name      string
		principal events.Principal
		ip        string
		penalized bool
	}{
		{"allowlisted principal", allowedBot, "203.0.113.9", false},
		{"from an allowlisted CIDR", events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "office")}, "192.0.2.44", false},
		{"expired CIDR entry does not protect", events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "exp")}, "198.18.0.1", true},
		{"anyone else", events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "other")}, "203.0.113.9", true},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			pub := &flakyPublisher{}
			d := newTestDetector(t, pub, func(c *Config) { c.Records = records; c.Allowlist = allow })
			botBurst(t, d, tc.principal, time.Now().Add(-time.Minute), tc.ip)
			m, _, err := d.cfg.Penalties.Get(ctx, tc.principal)
			require.NoError(t, err)
			if tc.penalized {
				require.Equal(t, 0.1, m)
				require.Len(t, pub.msgs, 1)
			} else {
				require.Equal(t, 1.0, m)
				require.Empty(t, pub.msgs)
			}
		})
	}
}

type alerts struct {
	mu   sync.Mutex
	keys []string
}

func (a *alerts) Alert(_ context.Context, key, _ string, _ map[string]any) error {
	a.mu.Lock()
	a.keys = append(a.keys, key)
	a.mu.Unlock()
	return nil
}

func TestBlastRadiusGuardHoldsEnforcementAndPages(t *testing.T) {
	pub := &flakyPublisher{}
	al := &alerts{}
	d := newTestDetector(t, pub, func(c *Config) { c.BlastLimit = 3; c.Alerter = al })
	run := redistest.Unique(t, "blast")
	start := time.Now().Add(-time.Minute)
	for b := 0; b < 5; b++ {
		botBurst(t, d, events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("%s_%d", run, b)}, start, "203.0.113.9")
	}
	require.Len(t, pub.msgs, 5)
	modes := map[events.PenaltyMode]int{}
	for _, m := range pub.msgs {
		a, err := events.DecodeAbuse(m.Value)
		require.NoError(t, err)
		modes[a.Penalty.Mode]++
	}
	require.Equal(t, map[events.PenaltyMode]int{events.PenaltyEnforced: 3, events.PenaltySimulated: 2}, modes)
	require.Equal(t, []string{"floodgate:blast_radius:rapid_fire"}, al.keys, "one page for the hold")
	m, _, err := d.cfg.Penalties.Get(context.Background(), events.Principal{Kind: events.PrincipalBot, ID: run + "_4"})
	require.NoError(t, err)
	require.Equal(t, 1.0, m, "held: no penalty written")
}

func TestSimulatedPatternWritesNoPenalty(t *testing.T) {
	pub := &flakyPublisher{}
	d := newTestDetector(t, pub, func(c *Config) {
		c.Policies[score.RapidFire] = PatternPolicy{Multiplier: 0.1, TTL: time.Hour, Enforce: false}
	})
	bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "shadow")}
	botBurst(t, d, bot, time.Now().Add(-time.Minute), "203.0.113.9")
	require.Len(t, pub.msgs, 1)
	a, err := events.DecodeAbuse(pub.msgs[0].Value)
	require.NoError(t, err)
	require.Equal(t, events.PenaltySimulated, a.Penalty.Mode)
	m, _, err := d.cfg.Penalties.Get(context.Background(), bot)
	require.NoError(t, err)
	require.Equal(t, 1.0, m)
}

// actions are "<event_action> <dedup_key>" of every event the receiver
// accepted.
func actions(recv *stacktest.PagerDuty) []string {
	var out []string
	for _, e := range recv.All() {
		out = append(out, fmt.Sprint(e["event_action"], " ", e["dedup_key"]))
	}
	return out
}

// redisPager is a pager on the local Redis (its open-incident key unique
// to the test) paging recv at most 2 times a minute.
func redisPager(t *testing.T, recv *stacktest.PagerDuty) (*Pager, redis.UniversalClient) {
	t.Helper()
	rdb := redistest.Client(t)
	openKey := redistest.Unique(t, OpenIncidentsKey)
	p, err := NewPager(PagerConfig{RoutingKey: "rk", Endpoint: recv.URL, MinSeverity: "critical", PerMinute: 2, Redis: rdb, OpenKey: openKey, Now: time.Now,
		Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry()})
	require.NoError(t, err)
	t.Cleanup(func() { rdb.Del(context.Background(), openKey) })
	return p, rdb
}

func TestPagerTriggersCapsAndResolvesWhenThePenaltyIsLifted(t *testing.T) {
	ctx := context.Background()
	recv := stacktest.PagerDutyFor(t)
	p, rdb := redisPager(t, recv)
	store := NewPenaltyStore(rdb)

	var bots []events.Principal
	for i := 0; i < 3; i++ {
		bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, fmt.Sprint("pg", i))}
		bots = append(bots, bot)
		a := events.Abuse{ID: fmt.Sprintf("ab_%d_%d", i, time.Now().UnixNano()), DetectedAt: time.Now().UTC().Truncate(time.Millisecond), Principal: bot,
			Pattern: events.PatternRapidFire, Severity: events.SeverityCritical, Score: 12,
			Window:       events.Window{Start: time.Now().UTC().Truncate(time.Second), End: time.Now().UTC().Truncate(time.Second).Add(10 * time.Second), Seconds: 10},
			FirstEventAt: time.Now().UTC().Truncate(time.Millisecond), Evidence: events.Evidence{ObservedRate: 24, EventCount: 240},
			Penalty:         events.Penalty{Multiplier: 0.1, ExpiresAt: time.Now().Add(time.Hour).UTC().Truncate(time.Millisecond), Level: 1, Mode: events.PenaltyEnforced},
			DetectorVersion: Version}
		_, err := store.Apply(ctx, bot, a.ID, a.Penalty)
		require.NoError(t, err)
		b, err := events.EncodeAbuse(&a)
		require.NoError(t, err)
		require.NoError(t, p.Handle(ctx, kafka.Message{Value: b}))
	}
	require.Len(t, actions(recv), 2, "the per-minute cap holds the third trigger")

	// Nothing is resolved while penalties are in force.
	n, err := p.ResolveOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n)
	// The console lifts bot 0's penalty (deletes its key): its incident resolves.
	require.NoError(t, rdb.Del(ctx, redisx.PenaltyKey(string(bots[0].Kind), bots[0].ID)).Err())
	n, err = p.ResolveOnce(ctx)
	require.NoError(t, err)
	require.Equal(t, 1, n)
	require.Contains(t, actions(recv), "resolve "+DedupKey(events.PatternRapidFire, bots[0]))
	n, err = p.ResolveOnce(ctx)
	require.NoError(t, err)
	require.Zero(t, n, "resolved once")
}

// TestPageOfDistributedIPNamesItsNetworks: a taken-over account spread
// over many addresses is slow, so its page says how many networks it came
// from against the line, not a rate of nearly nothing.
func TestPageOfDistributedIPNamesItsNetworks(t *testing.T) {
	ctx := context.Background()
	recv := stacktest.PagerDutyFor(t)
	p, _ := redisPager(t, recv)
	user := events.Principal{Kind: events.PrincipalUser, ID: redistest.Unique(t, "fanout")}
	now := time.Now().UTC().Truncate(time.Second)
	a := events.Abuse{ID: fmt.Sprintf("ab_fanout_%d", now.UnixNano()), DetectedAt: now, Principal: user,
		Pattern: events.PatternDistributedIP, Severity: events.SeverityCritical, Score: 12,
		Window: events.Window{Start: now.Add(-300 * time.Second), End: now, Seconds: 300}, FirstEventAt: now.Add(-20 * time.Second),
		Evidence: events.Evidence{ObservedRate: 12.0 / 300, EventCount: 12, DistinctIPs: 12, DistinctIP24: 12,
			Basis: &events.Basis{Source: events.BasisNetworks, BaselineKind: events.PrincipalUser, NewNetworks: 12, NetworkThreshold: 8}},
		Penalty:         events.Penalty{Multiplier: 0.5, ExpiresAt: now.Add(time.Hour), Level: 1, Mode: events.PenaltyEnforced},
		DetectorVersion: Version}
	b, err := events.EncodeAbuse(&a)
	require.NoError(t, err)
	require.NoError(t, p.Handle(ctx, kafka.Message{Value: b}))
	sent := recv.Events(DedupKey(events.PatternDistributedIP, user))
	require.Len(t, sent, 1)
	payload, _ := sent[0]["payload"].(map[string]any)
	summary := fmt.Sprint(payload["summary"])
	require.Contains(t, summary, "12 distinct addresses (12 IPv4 /24s, 0 IPv6 /64s) in 300s")
	require.Contains(t, summary, "against a line of 8 unshared networks")
	require.NotContains(t, summary, "/s", "no rate: %s", summary)
}

// TestPagerOutageDoesNotUseUpTheCap: attempts that fail while PagerDuty is down
// are retried (an error for the consume loop) and do not count against the
// per-minute cap, so every page goes out once PagerDuty is back.
func TestPagerOutageDoesNotUseUpTheCap(t *testing.T) {
	ctx := context.Background()
	recv := stacktest.PagerDutyFor(t)
	recv.FailNext(5)
	p, _ := redisPager(t, recv)
	page := func(i int) kafka.Message {
		bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, fmt.Sprint("out", i))}
		now := time.Now().UTC().Truncate(time.Millisecond)
		a := events.Abuse{ID: fmt.Sprintf("ab_out_%d_%d", i, now.UnixNano()), DetectedAt: now, Principal: bot,
			Pattern: events.PatternRapidFire, Severity: events.SeverityCritical, Score: 12,
			Window:       events.Window{Start: now.Truncate(time.Second), End: now.Truncate(time.Second).Add(10 * time.Second), Seconds: 10},
			FirstEventAt: now, Evidence: events.Evidence{ObservedRate: 24, EventCount: 240},
			Penalty:         events.Penalty{Multiplier: 0.1, ExpiresAt: now.Add(time.Hour), Level: 1, Mode: events.PenaltyEnforced},
			DetectorVersion: Version}
		b, err := events.EncodeAbuse(&a)
		require.NoError(t, err)
		return kafka.Message{Value: b}
	}
	first, second := page(1), page(2)
	for range 5 { // PagerDuty is down: every attempt fails and is reported for a retry
		require.Error(t, p.Handle(ctx, first))
	}
	require.NoError(t, p.Handle(ctx, first), "back up: the retried page goes out")
	require.NoError(t, p.Handle(ctx, second))
	require.Len(t, actions(recv), 2, "failed attempts did not use up the cap of 2 a minute")
}

// TestConsoleWrittenAllowlistEntries reads allowlist items written the way the
// console writes them (services/console/internal/store: AllowCIDR and
// Allowlist put exactly pk, expires_at, comment, created_by, created_at) with
// the detector's own loader, and checks they spare detections.
func TestConsoleWrittenAllowlistEntries(t *testing.T) {
	stacktest.Needs(t, "needs the local stack: `make test` runs it (`make test-unit` is -short, no stack)")
	records := dynamoRecords(t)
	ctx := context.Background()
	now := time.Now()
	bot := events.Principal{Kind: events.PrincipalBot, ID: redistest.Unique(t, "console")}
	put := func(pk string, exp time.Time) {
		_, err := records.Client.PutItem(ctx, &dynamodb.PutItemInput{TableName: aws.String(records.RuntimeTable), Item: map[string]types.AttributeValue{
			"pk":         &types.AttributeValueMemberS{Value: pk},
			"expires_at": &types.AttributeValueMemberN{Value: fmt.Sprint(exp.Unix())},
			"comment":    &types.AttributeValueMemberS{Value: "partner office NAT"},
			"created_by": &types.AttributeValueMemberS{Value: "analyst1"},
			"created_at": &types.AttributeValueMemberS{Value: now.UTC().Format(time.RFC3339)},
		}})
		require.NoError(t, err)
	}
	put("detector#allow#cidr#203.0.113.0/24", now.Add(7*24*time.Hour))
	put("detector#allow#cidr#2001:db8:abcd::/56", now.Add(time.Hour))
	put("detector#allow#cidr#198.51.100.0/24", now.Add(-time.Minute)) // expired
	put("detector#allow#principal#"+bot.Key(), now.Add(time.Hour))

	entries, err := records.LoadAllowlist(ctx, now)
	require.NoError(t, err)
	var al Allowlist
	al.Set(entries)
	ips := func(s ...string) []events.IPCount {
		var out []events.IPCount
		for _, v := range s {
			out = append(out, events.IPCount{IP: netip.MustParseAddr(v), Count: 1})
		}
		return out
	}
	other := events.Principal{Kind: events.PrincipalUser, ID: "u"}
	for _, c := range []struct {
		name string
		p    events.Principal
		ips  []events.IPCount
		ok   bool
		why  string
	}{
		{"every IP in a console CIDR", other, ips("203.0.113.7", "2001:db8:abcd:12::1"), true, "cidr"},
		{"one IP outside", other, ips("203.0.113.7", "192.0.2.1"), false, ""},
		{"expired CIDR", other, ips("198.51.100.5"), false, ""},
		{"console principal entry", bot, ips("192.0.2.1"), true, "principal"},
	} {
		t.Run(c.name, func(t *testing.T) {
			ok, why := al.Allows(c.p, c.ips, now)
			require.Equal(t, c.ok, ok)
			require.Equal(t, c.why, why)
		})
	}
}
