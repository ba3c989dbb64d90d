// Package e2e runs the built limiter and detector binaries against real
// infrastructure: Redis and InfluxDB from the local stack, a Kafka-protocol broker
// over TCP whose topics come from the migrations, and a local PagerDuty receiver.
package e2e

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"path/filepath"
	"strings"
	"testing"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// userEvery is the normal user's pace beside the bot: 10 checks a second,
// a fifth of its limit.
const userEvery = 100 * time.Millisecond

type checkResponse struct {
	Allowed           bool              `json:"allowed"`
	Tier              string            `json:"tier"`
	Limit             int               `json:"limit"`
	Remaining         int               `json:"remaining"`
	PenaltyMultiplier float64           `json:"penalty_multiplier"`
	Headers           map[string]string `json:"headers"`
	Problem           *struct {
		Type string `json:"type"`
	} `json:"problem"`
}

// TestRapidFireIsPenalizedEndToEnd: a bot firing far above the detector's threshold
// is penalized within seconds and its next decisions use the reduced limit, while
// a normal user sharing the same limiter keeps its full limit.
func TestRapidFireIsPenalizedEndToEnd(t *testing.T) {
	ctx := stacktest.Context(t, 3*time.Minute, "end-to-end test needs the local stack; run `make test`")
	stack := stacktest.Local()
	redisAddr, influxURL := stack.RedisAddrs, stack.InfluxURL

	rdb := redisx.NewClient(redisx.Options{Addrs: redisAddr})
	defer rdb.Close()
	require.NoError(t, redisx.Ping(ctx, rdb), "Redis from the local stack must be running (make up)")

	brokers := migrationstest.Broker(t, ctx, migrations.Runner{Influx: &migrations.Influx{URL: influxURL}})
	pages := stacktest.PagerDutyFor(t)
	bin := buildServices(t)
	run := time.Now().UnixNano()
	bot := events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("e2e_bot_%d", run)}
	user := events.Principal{Kind: events.PrincipalUser, ID: fmt.Sprintf("e2e_user_%d", run)}
	limiterAddr, detectorAddr := stacktest.FreeAddr(t), stacktest.FreeAddr(t)
	common := []string{
		"FLOODGATE_KAFKA_BROKERS=" + brokers,
		"FLOODGATE_REDIS_ADDRS=" + strings.Join(redisAddr, ","),
		"FLOODGATE_INFLUX_URL=" + influxURL,
	}
	stacktest.Exec(t, filepath.Join(bin, "limiter"), append(common,
		"FLOODGATE_LIMITER_ADDR="+limiterAddr,
		// Not the default 127.0.0.1:8081, which another test's limiter may hold.
		"FLOODGATE_LIMITER_GRPC_ADDR=off",
		"FLOODGATE_LIMITER_PRINCIPAL_LIMIT=50",
		"FLOODGATE_GATEWAY=e2e",
	))
	stacktest.Exec(t, filepath.Join(bin, "detector"), append(common,
		"FLOODGATE_DETECTOR_ADDR="+detectorAddr,
		fmt.Sprintf("FLOODGATE_DETECTOR_GROUP=e2e-detector-%d", run),
		fmt.Sprintf("FLOODGATE_PAGER_GROUP=e2e-pager-%d", run),
		"FLOODGATE_DETECTOR_WINDOW=5s",
		"FLOODGATE_DETECTOR_RAPID_FIRE_RATE=20",
		"FLOODGATE_DETECTOR_PENALTY_MULTIPLIER=0.1",
		"FLOODGATE_DETECTOR_PENALTY_TTL=2m",
		// One step: the first detection takes the full penalty, so the
		// arithmetic below (50 × 0.1) does not depend on the evidence grade.
		"FLOODGATE_DETECTOR_LADDER_STEPS=1",
		"FLOODGATE_PAGERDUTY_ROUTING_KEY=e2e-routing-key",
		"FLOODGATE_PAGERDUTY_URL="+pages.URL,
		"FLOODGATE_PAGERDUTY_MIN_SEVERITY=low",
	))
	waitReady(t, "http://"+limiterAddr+"/readyz")
	waitReady(t, "http://"+detectorAddr+"/readyz")

	client := &http.Client{Timeout: 2 * time.Second}
	check := func(p events.Principal, ip string) checkResponse {
		body := fmt.Sprintf(`{"principal":{"kind":%q,"id":%q},"ip":%q,"method":"POST","route":"/channels/{channel_id}/messages","resource":"channel:1"}`, p.Kind, p.ID, ip)
		resp, err := client.Post("http://"+limiterAddr+"/v1/check", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		require.Equal(t, http.StatusOK, resp.StatusCode)
		var out checkResponse
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&out))
		return out
	}

	first := check(user, "198.51.100.7")
	require.True(t, first.Allowed)
	require.Equal(t, 50, first.Limit, "the rule's limit before any penalty")

	// The bot fires checks back to back — thousands a second, far over the 20/s
	// threshold and its 50/s limit — until its decisions show the penalty; the
	// user keeps a human pace by the clock (10/s, well inside its 50/s), never
	// by the bot's: one user check per 100 bot checks was 67/s, over its limit,
	// when a fast bot waited 4 s for a slow detection.
	var penalized *checkResponse
	userResults := []checkResponse{first}
	start := time.Now()
	deadline, nextUser := start.Add(60*time.Second), start.Add(userEvery)
	var botChecks, botDenied int
	var last checkResponse
	for penalized == nil && time.Now().Before(deadline) {
		last = check(bot, "203.0.113.9")
		botChecks++
		if !last.Allowed {
			botDenied++
		}
		if last.PenaltyMultiplier < 1 {
			penalized = &last
		}
		if now := time.Now(); now.After(nextUser) {
			userResults = append(userResults, check(user, "198.51.100.7"))
			nextUser = now.Add(userEvery)
		}
	}
	took := time.Since(start)
	require.NotNil(t, penalized, "the rapid-fire bot was never penalized within %s: %d checks (%.0f/s; the detector needs over 100/s), %d denied, the last %+v",
		took.Round(time.Millisecond), botChecks, float64(botChecks)/took.Seconds(), botDenied, last)
	t.Logf("bot penalized after %d checks in %s (%.0f/s, %d denied)", botChecks, took.Round(time.Millisecond), float64(botChecks)/took.Seconds(), botDenied)
	penaltySeen := time.Now()
	require.InDelta(t, 0.1, penalized.PenaltyMultiplier, 1e-9)
	require.Equal(t, 5, penalized.Limit, "effective limit = rule 50 × penalty 0.1")

	// Its next decisions keep the reduced limit; once the 5 tokens are spent the
	// denial is attributed to the penalty, with the matching 429 problem type.
	var denied *checkResponse
	for i := 0; i < 20 && denied == nil; i++ {
		r := check(bot, "203.0.113.9")
		require.Equal(t, 5, r.Limit, "bot check %d after the penalty: %+v", i+1, r)
		if !r.Allowed {
			denied = &r
		}
	}
	require.NotNil(t, denied, "20 rapid checks against a limit of 5 must be denied; none was in %s", time.Since(penaltySeen).Round(time.Millisecond))
	require.Equal(t, "penalty", denied.Tier)
	require.Equal(t, "penalty", denied.Headers["X-RateLimit-Scope"])
	require.NotEmpty(t, denied.Headers["Retry-After"])
	require.NotNil(t, denied.Problem)
	require.Contains(t, denied.Problem.Type, "abnormal-usage")

	// The normal user was never touched.
	userResults = append(userResults, check(user, "198.51.100.7"))
	for i, r := range userResults {
		require.True(t, r.Allowed, "user check %d of %d (one each %s) was denied: %+v", i+1, len(userResults), userEvery, r)
		require.Equal(t, 50, r.Limit, "user check %d of %d: %+v", i+1, len(userResults), r)
		require.Equal(t, 1.0, r.PenaltyMultiplier, "user check %d of %d: %+v", i+1, len(userResults), r)
	}
	exists, err := rdb.Exists(ctx, redisx.PenaltyKey(string(user.Kind), user.ID)).Result()
	require.NoError(t, err)
	require.Zero(t, exists, "no penalty key for the normal user")
	ttl, err := rdb.PTTL(ctx, redisx.PenaltyKey(string(bot.Kind), bot.ID)).Result()
	require.NoError(t, err)
	require.Greater(t, ttl, time.Minute, "penalty carries its TTL")

	// The abuse event on Kafka carries the evidence. The detector publishes it
	// after the penalty is written and the abuse record put in DynamoDB, so it
	// may come well after the limiter showed the penalty.
	abuse := readAbuse(t, ctx, brokers, bot, penaltySeen, 30*time.Second)
	require.Equal(t, events.PatternRapidFire, abuse.Pattern)
	// The bot's pace depends on how busy the machine is; what must hold is that
	// a bot is measured against its limit (50/s here): the score is its rate
	// against what the limiter let through, past twice that it fires, and the
	// severity follows the denial ratio.
	require.NotNil(t, abuse.Evidence.Basis, "abuse event %+v", abuse)
	t.Logf("abuse evidence: score %.2f, observed %.0f/s, baseline %.1f/s, threshold %.1f/s, denial ratio %.2f, severity %s",
		abuse.Score, abuse.Evidence.ObservedRate, abuse.Evidence.BaselineRate, abuse.Evidence.Threshold, abuse.Evidence.Basis.DenialRatio, abuse.Severity)
	require.Equal(t, events.BasisLimit, abuse.Evidence.Basis.Source)
	require.GreaterOrEqual(t, abuse.Evidence.Basis.DenialRatio, 0.5)
	require.Greater(t, abuse.Evidence.ObservedRate, 20.0)
	require.InDelta(t, abuse.Evidence.ObservedRate/abuse.Evidence.BaselineRate, abuse.Score, 1e-6)
	require.InDelta(t, 2*abuse.Evidence.BaselineRate, abuse.Evidence.Threshold, 1e-6)
	require.NotEqual(t, events.SeverityLow, abuse.Severity, "past twice its limit is at least medium")
	require.Equal(t, int64(1), abuse.Evidence.DistinctIPs)
	require.Equal(t, events.PenaltyEnforced, abuse.Penalty.Mode)
	require.False(t, abuse.FirstEventAt.After(abuse.DetectedAt))

	// PagerDuty got one trigger for the bot, none for the user.
	page := pages.WaitFor(t, "floodgate:rapid_fire:"+bot.Key(), 20*time.Second)
	require.Equal(t, "trigger", page["event_action"])
	require.Equal(t, "e2e-routing-key", page["routing_key"])
	require.Empty(t, pages.Events("floodgate:rapid_fire:"+user.Key()))

	// The detection reached InfluxDB.
	requireInfluxDetection(t, ctx, influxURL, abuse.DetectedAt)
}

// readAbuse waits up to timeout for p's abuse event on the abuse topic,
// scanning all its partitions (kafkascan.All) again until it comes, and
// fails saying what the last scan held when it does not. penaltySeen is
// when the limiter first showed the penalty, for the log.
func readAbuse(t *testing.T, ctx context.Context, brokers string, p events.Principal, penaltySeen time.Time, timeout time.Duration) events.Abuse {
	t.Helper()
	c := &kafka.Client{Addr: kafka.TCP(brokers), Timeout: 10 * time.Second}
	var found *kafka.Message
	var others []string
	var err error
	for deadline := time.Now().Add(timeout); found == nil && time.Now().Before(deadline); {
		others = others[:0]
		err = kafkascan.All(ctx, c, config.DefaultAbuseTopic, func(m kafka.Message) bool {
			if string(m.Key) == p.Key() {
				found = &m
				return false
			}
			others = append(others, string(m.Key))
			return true
		})
		if found == nil {
			time.Sleep(200 * time.Millisecond)
		}
	}
	if found == nil {
		t.Fatalf("no abuse event for %s on %s within %s of the penalty showing: the last scan held %d other events %v (error: %v)",
			p.Key(), config.DefaultAbuseTopic, time.Since(penaltySeen).Round(time.Millisecond), len(others), others, err)
	}
	t.Logf("abuse event for %s on partition %d, written %s after the penalty showed", p.Key(), found.Partition, found.Time.Sub(penaltySeen).Round(time.Millisecond))
	a, err := events.DecodeAbuse(found.Value)
	require.NoError(t, err)
	return a
}

func requireInfluxDetection(t *testing.T, ctx context.Context, url string, at time.Time) {
	t.Helper()
	client := influxdb2.NewClient(url, "")
	defer client.Close()
	q := fmt.Sprintf(`from(bucket: %q) |> range(start: %s) |> filter(fn: (r) => r._measurement == "abuse_detections" and r._field == "score")`,
		config.DefaultInfluxBucket, at.Add(-time.Second).UTC().Format(time.RFC3339))
	deadline := time.Now().Add(15 * time.Second)
	for time.Now().Before(deadline) {
		res, err := client.QueryAPI("").Query(ctx, q)
		require.NoError(t, err)
		found := false
		for res.Next() {
			if res.Record().Value() != nil {
				found = true
			}
		}
		require.NoError(t, res.Err())
		if found {
			return
		}
		time.Sleep(500 * time.Millisecond)
	}
	t.Fatalf("no abuse_detections point in InfluxDB since %s", at)
}

// buildServices builds the services the end-to-end tests run.
func buildServices(t *testing.T) string {
	return stacktest.Build(t, "limiter", "detector", "quota", "dlq-auditor")
}

func waitReady(t *testing.T, url string) {
	t.Helper()
	stacktest.WaitOK(t, url, 30*time.Second)
}
