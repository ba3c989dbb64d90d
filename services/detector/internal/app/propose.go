package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"os"
	"sort"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb/types"
	"github.com/google/uuid"

	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
	"github.com/floodgate-dev/floodgate/services/detector/internal/detector"
	"github.com/floodgate-dev/floodgate/services/detector/internal/score"
	"github.com/floodgate-dev/floodgate/services/detector/internal/tuning"
)

// Propose is `detector propose` (docs/detector.md, Tuning proposals): it
// reads the reviewers' verdicts on the detections of the last -span, the
// decisions recorded over that span and the detector parameters in force
// (the parameters topic's enforced version, when FLOODGATE_DETECTOR_PARAMS_TOPIC
// is set), builds the best proposal of every class with at least -min-fps
// false-positive verdicts, proves it by replay, prints it and stores it
// (floodgate_runtime_config) for the console's proposals page.
func Propose(ctx context.Context, env service.Env, args []string) error {
	fs := flag.NewFlagSet("propose", flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	span := fs.Duration("span", time.Hour, "the recorded decisions and the verdicted detections of this long before now (1m..24h)")
	minFPs := fs.Int("min-fps", 3, "false-positive verdicts a class needs for a proposal")
	maxRead := fs.Int("max-detections", 200_000, "abuse records of the span read at most (judged or not); more is refused")
	dry := fs.Bool("dry-run", false, "print the proposals, store nothing")
	host, _ := os.Hostname()
	as := fs.String("as", "detector-propose@"+host, "the proposer's name on the stored proposals")
	if err := fs.Parse(args); err != nil {
		return err
	}
	if *span < time.Minute || *span > 24*time.Hour {
		return fmt.Errorf("-span %s: must be in 1m..24h", *span)
	}
	if *minFPs < 1 || *minFPs > 1000 {
		return fmt.Errorf("-min-fps %d: must be in 1..1000", *minFPs)
	}
	if *maxRead < 1 || *maxRead > 10_000_000 {
		return fmt.Errorf("-max-detections %d: must be in 1..10000000", *maxRead)
	}
	cfg, err := detector.ServiceConfigFromEnv(env.Getenv)
	if err != nil {
		return err
	}
	if cfg.Records != "dynamodb" {
		return errors.New("propose reads the verdicts from the abuse records: FLOODGATE_DETECTOR_RECORDS must be dynamodb")
	}
	ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: cfg.DynamoEndpoint, TablePrefix: cfg.DynamoPrefix})
	if err != nil {
		return err
	}
	ksec, err := stream.NewSecurity(ctx, cfg.KafkaSecurity)
	if err != nil {
		return err
	}
	to := env.Now().UTC()
	from := to.Add(-*span)
	verdicts, err := readVerdicts(ctx, ddb, cfg.DynamoPrefix+dynamo.TableAbuseRecords, from, to, *maxRead)
	if err != nil {
		return err
	}
	cur, curVersion := score.Params{}, int64(0)
	if cfg.ParamsTopic != "" {
		topic := rollout.NewTopic(cfg.KafkaBrokers, ksec, cfg.ParamsTopic, env.Log)
		st, err := topic.Read(ctx)
		_ = topic.Close()
		if err != nil {
			return fmt.Errorf("read the detector parameters in force: %w", err)
		}
		if e, ok := st.Enforced(); ok {
			if cur, err = score.ParseParams([]byte(e.Rules)); err != nil {
				return fmt.Errorf("the enforced parameters version %d: %w", e.Version, err)
			}
			curVersion = e.Version
		}
	}
	src := &whatif.Source{Client: ksec.Client(cfg.KafkaBrokers, 10*time.Second), Topic: cfg.DecisionsTopic}
	recs, _, err := src.Read(ctx, from, to)
	if err != nil {
		return fmt.Errorf("read the recorded decisions: %w", err)
	}
	ds := make([]events.Decision, len(recs))
	for i := range recs {
		ds[i] = recs[i].Decision
	}
	built, err := tuning.Propose(ds, cfg.Score, cur, verdicts, *minFPs, tuning.Targets{MinClassAvoided: 0.9, MinKept: 0.995})
	if err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%d decisions recorded in %s..%s, %d verdicts, parameters version %d in force: %d proposals\n",
		len(ds), from.Format(time.RFC3339), to.Format(time.RFC3339), len(verdicts), curVersion, len(built))
	for _, b := range built {
		p := stored(b, from, to, curVersion, *as, env.Now())
		fmt.Fprintf(env.Stdout, "%s  %s: %s — confirmed kept %d/%d, class false positives avoided %d/%d, meets targets %v\n",
			p.ID, p.Class(), b.Proposal, p.Evidence.ConfirmedKept, p.Evidence.Confirmed, p.Evidence.ClassFPAvoided, p.Evidence.ClassFPs, p.Meets)
		if *dry {
			continue
		}
		if err := dynamo.PutProposal(ctx, ddb, cfg.DynamoPrefix+dynamo.TableRuntimeConfig, p); err != nil {
			return err
		}
	}
	return nil
}

// stored is a built proposal as the console reads it.
func stored(b tuning.Built, from, to time.Time, base int64, by string, now time.Time) dynamo.Proposal {
	p := dynamo.Proposal{ID: uuid.Must(uuid.NewV7()).String(), CreatedAt: now.UTC(), CreatedBy: by,
		Pattern: string(b.Proposal.Class.Pattern), Kind: string(b.Proposal.Class.Kind), Route: b.Proposal.Class.Route, FromVerdicts: b.Proposal.From,
		Params: string(b.Proposal.Params.Marshal()), BaseVersion: base, SpanFrom: from, SpanTo: to, Decisions: b.Decisions, Meets: b.Meets,
		Evidence: b.Evaluation.Evidence}
	for _, c := range b.Proposal.Changes {
		p.Changes = append(p.Changes, dynamo.ProposalChange{Param: c.Param, From: c.From, To: c.To})
	}
	return p
}

// detectedAt is how an abuse record's gsi1sk holds its detection time
// (detector.DynamoRecords).
const detectedAt = "2006-01-02T15:04:05.000Z"

// ErrTooManyDetections is returned when the span holds more detections than
// propose reads (-max-detections).
var ErrTooManyDetections = errors.New("too many detections in the span")

// readVerdicts reads the verdicts on the detections made in [from, to) —
// the latest verdict of each principal's latest judged detection — by
// querying the abuse records' day index (gsi1: day#YYYY-MM-DD, detected_at)
// for each day of the span, never scanning the table. At most maxRead
// records are read (judged or not); a span holding more is refused with
// ErrTooManyDetections.
func readVerdicts(ctx context.Context, ddb *dynamodb.Client, table string, from, to time.Time, maxRead int) ([]tuning.Verdicted, error) {
	type judged struct {
		sk string
		v  events.VerdictValue
	}
	latest := map[string]judged{}
	read := 0
	for day := from.UTC().Truncate(24 * time.Hour); day.Before(to); day = day.Add(24 * time.Hour) {
		pages := dynamodb.NewQueryPaginator(ddb, &dynamodb.QueryInput{TableName: aws.String(table), IndexName: aws.String("gsi1"),
			KeyConditionExpression:   aws.String("gsi1pk = :d AND gsi1sk BETWEEN :from AND :to"),
			FilterExpression:         aws.String("attribute_exists(#v)"),
			ProjectionExpression:     aws.String("pk, sk, #v"),
			ExpressionAttributeNames: map[string]string{"#v": dynamo.AttrVerdict},
			ExpressionAttributeValues: map[string]types.AttributeValue{":d": &types.AttributeValueMemberS{Value: "day#" + day.Format("2006-01-02")},
				// BETWEEN is inclusive: to less a millisecond keeps the span half-open
				":from": &types.AttributeValueMemberS{Value: from.UTC().Format(detectedAt)},
				":to":   &types.AttributeValueMemberS{Value: to.UTC().Add(-time.Millisecond).Format(detectedAt)}}})
		for pages.HasMorePages() {
			page, err := pages.NextPage(ctx)
			if err != nil {
				return nil, fmt.Errorf("query the verdicts of %s: %w", day.Format("2006-01-02"), err)
			}
			if read += int(page.ScannedCount); read > maxRead {
				return nil, fmt.Errorf("read the verdicts of %s..%s: %w (more than %d); shorten -span or raise -max-detections",
					from.Format(time.RFC3339), to.Format(time.RFC3339), ErrTooManyDetections, maxRead)
			}
			for _, it := range page.Items {
				pk, sk := dynamo.Str(it["pk"]), dynamo.Str(it["sk"])
				if cur, ok := latest[pk]; !ok || sk > cur.sk {
					latest[pk] = judged{sk, events.VerdictValue(dynamo.Str(it[dynamo.AttrVerdict]))}
				}
			}
		}
	}
	out := make([]tuning.Verdicted, 0, len(latest))
	for pk, l := range latest {
		out = append(out, tuning.Verdicted{Principal: pk, Verdict: l.v})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].Principal < out[j].Principal })
	return out, nil
}
