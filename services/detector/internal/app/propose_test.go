package app

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
	"maps"
	"slices"
	"testing"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/loadtest/labeled"
	"github.com/floodgate-dev/floodgate/migrations/migrationstest"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
	"github.com/floodgate-dev/floodgate/services/detector/internal/tuning"
)

// mistunedParams is the parameters version in force in the propose tests: a
// people rule that lets a 1 s burst count as sustained pressure (the
// environment's default is 5 s), which penalizes people with several
// devices on the held-out families.
const mistunedParams = "overrides:\n    - kind: user\n      person_sustain: 1s\n"

// TestProposeAgainstTheStack runs `detector propose` as the process does
// against the local stack's DynamoDB Local and a broker: labeled decisions
// recorded on the decisions topic, the mistuned parameters enforced on the
// parameters topic, and the abuse records of the replayed detections in
// floodgate_abuse_records with the verdicts a reviewer gives from the
// labels. Records outside the span and detections nobody judged are there
// too and count for nothing. The stored proposal must be the one the
// tuning package builds in memory from the same decisions and verdicts —
// the class, the moves and every replay figure — and meet the targets.
func TestProposeAgainstTheStack(t *testing.T) {
	ctx := stacktest.Context(t, 4*time.Minute, "the local stack's DynamoDB Local; run `make test`")
	ddb, prefix := migrationstest.DynamoTables(t, "prop", dynamo.TableAbuseRecords, dynamo.TableRuntimeConfig)
	paramsTopic := "floodgate.detector-params.v1"
	broker := kafkatest.Start(t, map[string]int32{config.DefaultDecisionsTopic: 1, paramsTopic: 1})

	now := time.Now().UTC().Truncate(time.Millisecond)
	ds, labels := recordLabeled(t, ctx, broker, now.Add(-4*time.Minute))
	cur := enforceParams(t, ctx, broker, paramsTopic, mistunedParams)

	// The detections of the parameters in force, judged from the labels:
	// every confirmed one, the false positives, and one detection of each
	// kind left unjudged.
	tu, err := score.Compile(score.DefaultConfig(), cur, 0)
	require.NoError(t, err)
	dets := tuning.Detections(ds, score.DefaultConfig(), tu)
	recs := &detector.DynamoRecords{Client: ddb, AbuseTable: prefix + dynamo.TableAbuseRecords, RuntimeTable: prefix + dynamo.TableRuntimeConfig, Retention: 24 * time.Hour}
	var verdicts []tuning.Verdicted
	fpsByClass := map[string]int{}
	unjudged := 0
	for _, k := range slices.Sorted(maps.Keys(dets)) {
		d := dets[k]
		a := abuseOf(d, d.At)
		require.NoError(t, recs.Put(ctx, &a))
		v := events.VerdictFalsePositive
		if labels[k].Abusive {
			v = events.VerdictConfirmed
		}
		if unjudged < 2 && v == events.VerdictConfirmed {
			unjudged++ // a detection nobody judged yet
			continue
		}
		judge(t, ctx, ddb, prefix, a, v)
		verdicts = append(verdicts, tuning.Verdicted{Principal: k, Verdict: v})
		if v == events.VerdictFalsePositive {
			fpsByClass[string(d.Pattern)+"/"+string(d.Principal.Kind)]++
		}
	}
	t.Logf("%d decisions, %d detections with the parameters in force, %d judged; false positives by class %v", len(ds), len(dets), len(verdicts), fpsByClass)
	require.GreaterOrEqual(t, fpsByClass["rapid_fire/user"], 3, "the mistuned parameters must penalize people")

	// Judged detections outside the span: an old confirmed one that would
	// count against any proposal, and old false positives of a class that
	// has none in the span. Neither may be read.
	old := now.Add(-3 * time.Hour)
	for i, v := range []events.VerdictValue{events.VerdictConfirmed, events.VerdictFalsePositive, events.VerdictFalsePositive, events.VerdictFalsePositive} {
		d := score.Detection{Pattern: events.PatternDistributedIP, Principal: events.Principal{Kind: events.PrincipalAPIKey, ID: fmt.Sprint("old_", i)}, At: old, WindowStart: old, Window: 10 * time.Second, Score: 9}
		a := abuseOf(d, old)
		require.NoError(t, recs.Put(ctx, &a))
		judge(t, ctx, ddb, prefix, a, v)
	}

	// What the tuning package builds from the same decisions and verdicts.
	targets := tuning.Targets{MinClassAvoided: 0.9, MinKept: 0.995}
	want, err := tuning.Propose(ds, score.DefaultConfig(), cur, verdicts, 3, targets)
	require.NoError(t, err)
	require.Len(t, want, 1, "one class has three false positives")

	env := map[string]string{
		"FLOODGATE_KAFKA_BROKERS":         broker,
		"FLOODGATE_DETECTOR_PARAMS_TOPIC": paramsTopic,
		"FLOODGATE_DETECTOR_RECORDS":      "dynamodb",
		"FLOODGATE_DYNAMODB_ENDPOINT":     migrationstest.DynamoEndpoint(),
		"FLOODGATE_DYNAMODB_TABLE_PREFIX": prefix,
	}
	var out, errOut bytes.Buffer
	var logs stacktest.Log
	senv := service.NewEnv("detector", service.Stdio{Getenv: stacktest.Getenv(env), Stdout: &out, Stderr: &errOut}, logs.Logger(slog.LevelInfo))
	senv.Now = func() time.Time { return now }
	require.NoError(t, Propose(ctx, senv, []string{"-span", "10m", "-min-fps", "3", "-as", "propose-test"}), "stderr: %s\nlogs: %s", errOut.String(), logs.String())
	t.Log(out.String())
	require.Contains(t, out.String(), fmt.Sprintf("%d decisions recorded", len(ds)))
	require.Contains(t, out.String(), fmt.Sprintf("%d verdicts, parameters version 1 in force: 1 proposals", len(verdicts)))

	got, err := dynamo.ListProposals(ctx, ddb, prefix+dynamo.TableRuntimeConfig)
	require.NoError(t, err)
	require.Len(t, got, 1)
	p, w := got[0], want[0]
	require.Equal(t, string(w.Proposal.Class.Pattern), p.Pattern)
	require.Equal(t, string(w.Proposal.Class.Kind), p.Kind)
	require.Equal(t, w.Proposal.Class.Route, p.Route)
	require.Equal(t, w.Proposal.From, p.FromVerdicts)
	require.Equal(t, string(w.Proposal.Params.Marshal()), p.Params)
	require.EqualValues(t, 1, p.BaseVersion)
	require.Equal(t, len(ds), p.Decisions)
	require.Equal(t, "propose-test", p.CreatedBy)
	require.Equal(t, now.Add(-10*time.Minute), p.SpanFrom.UTC())
	require.Equal(t, now, p.SpanTo.UTC())
	e := w.Evaluation
	require.Equal(t, dynamo.Evidence{Confirmed: e.Confirmed, ConfirmedKept: e.ConfirmedKept, FalsePositives: e.FalsePositives, FPAvoided: e.FPAvoided,
		ClassFPs: e.ClassFPs, ClassFPAvoided: e.ClassFPAvoided, NewDetections: e.NewDetections}, p.Evidence)
	require.Equal(t, w.Meets, p.Meets)
	require.True(t, p.Meets, "the proposal meets the targets: %+v", p.Evidence)
	require.Equal(t, len(verdicts)-fpsByClass["rapid_fire/user"], p.Evidence.Confirmed, "every confirmed verdict of the span, none older")
	require.Equal(t, fpsByClass["rapid_fire/user"], p.Evidence.ClassFPs)
	for _, c := range w.Proposal.Changes {
		require.Contains(t, p.Changes, dynamo.ProposalChange{Param: c.Param, From: c.From, To: c.To})
	}
	_, err = score.ParseParams([]byte(p.Params))
	require.NoError(t, err, "the stored document is a parameters document")
}

// TestProposeReadsABoundedSpan: the verdicts come from the day index of the
// span, never a scan, and a span holding more detections than
// -max-detections is refused before anything is replayed.
func TestProposeReadsABoundedSpan(t *testing.T) {
	ctx := stacktest.Context(t, 2*time.Minute, "the local stack's DynamoDB Local; run `make test`")
	ddb, prefix := migrationstest.DynamoTables(t, "propb", dynamo.TableAbuseRecords)
	table := prefix + dynamo.TableAbuseRecords
	// The records live their retention after detection (the table's TTL,
	// which DynamoDB Local applies within seconds): around the last midnight,
	// the oldest is at most 25 h 30 min old, so 48 h outlive the test.
	recs := &detector.DynamoRecords{Client: ddb, AbuseTable: table, Retention: 48 * time.Hour}
	// Spans crossing midnight read both days.
	midnight := time.Now().UTC().Truncate(24 * time.Hour)
	at := []time.Duration{-90 * time.Minute, -time.Minute, time.Minute, 90 * time.Minute, 3 * time.Hour}
	for i, off := range at {
		d := score.Detection{Pattern: events.PatternRapidFire, Principal: events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprint("b", i)}, At: midnight.Add(off),
			WindowStart: midnight.Add(off), Window: 10 * time.Second, Score: 9}
		a := abuseOf(d, d.At)
		require.NoError(t, recs.Put(ctx, &a))
		if i != 1 {
			judge(t, ctx, ddb, prefix, a, events.VerdictConfirmed)
		}
	}
	got, err := readVerdicts(ctx, ddb, table, midnight.Add(-2*time.Hour), midnight.Add(2*time.Hour), 100)
	require.NoError(t, err)
	require.Equal(t, []tuning.Verdicted{{Principal: "bot:b0", Verdict: events.VerdictConfirmed}, {Principal: "bot:b2", Verdict: events.VerdictConfirmed},
		{Principal: "bot:b3", Verdict: events.VerdictConfirmed}}, got, "the judged detections of the span, on both days; b1 was not judged, b4 is later")
	got, err = readVerdicts(ctx, ddb, table, midnight.Add(-time.Minute), midnight.Add(time.Minute), 100)
	require.NoError(t, err)
	require.Empty(t, got, "the span is half-open: [from, to)")
	_, err = readVerdicts(ctx, ddb, table, midnight.Add(-2*time.Hour), midnight.Add(2*time.Hour), 3)
	require.ErrorIs(t, err, ErrTooManyDetections, "four records in the span, three allowed")
}

// recordLabeled produces a held-out labeled stream starting at start onto
// the decisions topic — each message keyed by its principal and stamped
// with its decision's time, as the limiter's producer does — and returns
// the decisions and their labels.
func recordLabeled(t *testing.T, ctx context.Context, broker string, start time.Time) ([]events.Decision, map[string]*labeled.Label) {
	t.Helper()
	s, err := labeled.NewHeldOut(labeled.HeldOut{Seed: 7, Start: start, Duration: 3 * time.Minute, Legit: 1000, Abusive: 60, Prefix: "pt_"})
	require.NoError(t, err)
	ds := s.All()
	kafkatest.ProduceDecisions(t, ctx, broker, config.DefaultDecisionsTopic, ds)
	return ds, s.Labels()
}

// enforceParams publishes doc as the first (enforced) parameters version.
func enforceParams(t *testing.T, ctx context.Context, broker, topic, doc string) score.Params {
	t.Helper()
	tp := rollout.NewTopic([]string{broker}, nil, topic, nil)
	defer tp.Close()
	op := &rollout.Operator{Topic: tp, Validate: func(_ string, b []byte) error { _, err := score.ParseParams(b); return err }}
	_, err := op.Bootstrap(ctx, doc, rollout.Actor{Name: "sre1", Reason: "the parameters in force", Via: "cli"})
	require.NoError(t, err)
	p, err := score.ParseParams([]byte(doc))
	require.NoError(t, err)
	return p
}

// abuseOf is the abuse record of a detection at at.
func abuseOf(d score.Detection, at time.Time) events.Abuse {
	return events.Abuse{ID: detector.AbuseID(d.Principal, d.Pattern, d.WindowStart), DetectedAt: at.UTC(), Principal: d.Principal, Pattern: d.Pattern,
		Severity: events.SeverityHigh, Score: d.Score,
		Window:       events.Window{Start: d.WindowStart.UTC(), End: d.WindowStart.Add(d.Window).UTC(), Seconds: max(int64(d.Window/time.Second), 1)},
		FirstEventAt: at.UTC(), Evidence: events.Evidence{ObservedRate: max(d.ObservedRate, 1), EventCount: max(d.Count, 1)},
		Penalty:         events.Penalty{Multiplier: 0.1, ExpiresAt: at.Add(time.Hour).UTC(), Level: 1, Mode: events.PenaltyEnforced},
		DetectorVersion: detector.Version}
}

// judge sets a reviewer's verdict on the abuse record of a, as the console
// stores it (pkg/dynamo's AttrVerdict*).
func judge(t *testing.T, ctx context.Context, ddb *dynamodb.Client, prefix string, a events.Abuse, v events.VerdictValue) {
	t.Helper()
	s := func(x string) types.AttributeValue { return &types.AttributeValueMemberS{Value: x} }
	_, err := ddb.UpdateItem(ctx, &dynamodb.UpdateItemInput{TableName: aws.String(prefix + dynamo.TableAbuseRecords),
		Key:                       map[string]types.AttributeValue{"pk": s(a.Principal.Key()), "sk": s(a.DetectedAt.UTC().Format(detectedAt) + "#" + a.ID)},
		ConditionExpression:       aws.String("attribute_exists(pk)"),
		UpdateExpression:          aws.String("SET #v = :v, #vby = :by, #vat = :at"),
		ExpressionAttributeNames:  map[string]string{"#v": dynamo.AttrVerdict, "#vby": dynamo.AttrVerdictBy, "#vat": dynamo.AttrVerdictAt},
		ExpressionAttributeValues: map[string]types.AttributeValue{":v": s(string(v)), ":by": s("analyst1"), ":at": s(time.Now().UTC().Format(time.RFC3339Nano))}})
	require.NoError(t, err, "verdict on %s", a.ID)
}
