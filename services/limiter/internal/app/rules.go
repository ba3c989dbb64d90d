package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"strings"
	"text/tabwriter"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
)

const usage = `usage:
  limiter [serve]                            answer checks (the default)
  limiter validate FILE                      check a rules file; every problem with its line
  limiter whatif [flags]                     replay recorded decisions through a candidate rules file (docs/whatif.md)
  limiter rollout FILE -reason R [flags]     start FILE as a candidate in shadow on the rules topic
  limiter promote -reason R                  enforce the candidate now, ahead of its shadow period
  limiter rollback -reason R                 abort the candidate in shadow, or restore the enforced version's parent
  limiter status                             the enforced version, the rollout in progress, its diff and live impact

The rollout commands read FLOODGATE_KAFKA_BROKERS (and FLOODGATE_KAFKA_TLS*,
_SASL_*), FLOODGATE_RULES_TOPIC (default floodgate.rules.v1),
FLOODGATE_REDIS_ADDRS for the live impact and FLOODGATE_DYNAMODB_ENDPOINT,
FLOODGATE_DYNAMODB_TABLE_PREFIX for the audit log. See docs/rollouts.md.`

// Command runs a subcommand other than serve.
func Command(ctx context.Context, env service.Env) error {
	args := env.Args
	switch args[0] {
	case "validate":
		return validateCmd(args[1:], env.Stdout)
	case "whatif":
		return runWhatIf(ctx, env, args[1:])
	case "rollout", "promote", "rollback":
		return changeCmd(ctx, env, args[0], args[1:])
	case "status":
		return statusCmd(ctx, env, args[1:])
	case "-h", "--help", "help":
		_, err := fmt.Fprintln(env.Stdout, usage)
		return err
	}
	return fmt.Errorf("unknown command %q\n%s", args[0], usage)
}

func validateRules(name string, b []byte) error {
	_, err := limiter.ParseRules(name, b)
	return err
}

// validateCmd checks one rules file.
func validateCmd(args []string, out io.Writer) error {
	if len(args) != 1 {
		return fmt.Errorf("validate: want one FILE\n%s", usage)
	}
	rs, _, err := limiter.LoadRulesFile(args[0])
	if err != nil {
		return err
	}
	_, err = fmt.Fprintf(out, "%s: valid: %d rules, %d quotas\n", args[0], len(rs.Rules), len(rs.Quotas))
	return err
}

// rulesEnv is what the rollout commands connect to.
type rulesEnv struct {
	topic  *rollout.Topic
	audit  *rollout.DynamoAudit
	claims *rollout.DynamoClaims // changes are compare-and-set on the topic (docs/rollouts.md)
}

func openRules(ctx context.Context, env service.Env, withAudit bool) (*rulesEnv, error) {
	e := config.NewEnv(env.Getenv)
	brokers := e.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers)
	name := e.String("FLOODGATE_RULES_TOPIC", config.DefaultRulesTopic)
	ksec := config.ReadKafkaSecurity(e)
	endpoint, prefix := e.String("FLOODGATE_DYNAMODB_ENDPOINT", ""), e.String("FLOODGATE_DYNAMODB_TABLE_PREFIX", "")
	if err := e.Err(); err != nil {
		return nil, err
	}
	if err := rollout.ValidTopic(name); err != nil {
		return nil, fmt.Errorf("FLOODGATE_RULES_TOPIC: %w", err)
	}
	sec, err := stream.Secure(ctx, brokers, ksec, 10*time.Second, env.Log)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	re := &rulesEnv{topic: rollout.NewTopic(brokers, sec, name, env.Log)}
	if withAudit {
		ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: endpoint, TablePrefix: prefix})
		if err != nil {
			return nil, err
		}
		table := prefix + dynamo.TableAuditLog
		// A change nobody can audit is not made: check the table first.
		if _, err := ddb.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(table)}); err != nil {
			return nil, fmt.Errorf("audit log %s (FLOODGATE_DYNAMODB_ENDPOINT, FLOODGATE_DYNAMODB_TABLE_PREFIX): %w", table, err)
		}
		re.audit = &rollout.DynamoAudit{Client: ddb, Table: table}
		re.claims = &rollout.DynamoClaims{Client: ddb, Table: table}
	}
	return re, nil
}

// changeCmd runs rollout, promote and rollback.
func changeCmd(ctx context.Context, env service.Env, cmd string, args []string) error {
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(env.Stderr)
	reason := fs.String("reason", "", "why (required; goes to the audit log and the topic)")
	as := fs.String("as", env.Getenv("USER"), "who (default $USER)")
	def := rollout.DefaultParams()
	shadow := fs.Duration("shadow", def.ShadowFor, "rollout: how long the candidate runs in shadow before promotion")
	watch := fs.Duration("watch", def.WatchFor, "rollout: how long it is watched once enforced")
	maxBlock := fs.Float64("max-critical-block", 100*def.MaxShare, "rollout: the CRITICAL block share, in percent, above which it is rolled back")
	minCritical := fs.Int64("min-critical", def.MinCritical, "rollout: CRITICAL decisions judged before the share decides")
	steps := fs.String("steps", def.Steps, `rollout: after the shadow, the gradual steps as percentages of principals (by a hash of the principal), the last 100; "none" promotes at once`)
	stepWindow := fs.Duration("step-window", def.StepWindow, "rollout: how long each step is watched before the next")
	bootstrap := fs.Bool("bootstrap", false, "rollout: publish FILE as the first enforced version (an empty topic only)")
	whatIfSpan := fs.String("whatif", "10m", `rollout, the first gate: replay this much recorded traffic (a duration before now) through FILE against the enforced version; a reject verdict refuses the rollout; "0" skips it`)
	var file string
	if cmd == "rollout" && len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		file, args = args[0], args[1:]
	}
	if err := fs.Parse(args); err != nil {
		return err
	}
	if fs.NArg() > 0 || (cmd == "rollout" && file == "") {
		return fmt.Errorf("%s: unexpected arguments %q\n%s", cmd, fs.Args(), usage)
	}
	actor := rollout.Actor{Name: *as, Reason: *reason, Via: "cli"}
	var rules []byte
	if cmd == "rollout" {
		var err error
		if rules, err = os.ReadFile(file); err != nil {
			return fmt.Errorf("read rules: %w", err)
		}
		if err := validateRules(file, rules); err != nil {
			return err
		}
	}
	if strings.TrimSpace(*reason) == "" {
		return fmt.Errorf("%s: -reason is required", cmd)
	}
	re, err := openRules(ctx, env, true)
	if err != nil {
		return err
	}
	defer re.topic.Close()
	op := &rollout.Operator{Topic: re.topic, Audit: re.audit, Claims: re.claims, Validate: validateRules}
	var plan rollout.Plan
	switch {
	case cmd == "rollout" && *bootstrap:
		plan, err = op.Bootstrap(ctx, string(rules), actor)
	case cmd == "rollout":
		verdict := ""
		if *whatIfSpan != "0" {
			if verdict, err = whatIfGate(ctx, env, re.topic, file, *whatIfSpan); err != nil {
				return err
			}
			actor.Reason += " [" + verdict + "]"
		}
		p := rollout.Params{WhatIf: verdict, ShadowFor: *shadow, WatchFor: *watch, MaxShare: *maxBlock / 100, MinCritical: *minCritical, Steps: *steps, StepWindow: *stepWindow}
		if *steps == "none" {
			p.Steps = ""
		}
		plan, err = op.Propose(ctx, string(rules), p, actor)
	case cmd == "promote":
		plan, err = op.Promote(ctx, actor)
	default:
		plan, err = op.Rollback(ctx, actor)
	}
	if plan.Version == 0 && err != nil {
		return err
	}
	fmt.Fprintf(env.Stdout, "%s: version %d on %s\n", plan.Action, plan.Version, re.topic.Name)
	return err
}

// whatIfGate is a rollout's first gate: the decisions recorded over the last
// span replayed through the candidate file against the enforced version
// (pkg/whatif, docs/whatif.md). A reject verdict refuses the rollout before
// anything is published; otherwise the verdict, in words, goes into the
// rollout's reason.
func whatIfGate(ctx context.Context, env service.Env, topic *rollout.Topic, file, span string) (string, error) {
	baseline, baselineName, err := whatif.EnforcedBaseline(ctx, topic)
	if err != nil {
		return "", err
	}
	candidate, _, err := limiter.LoadRulesFile(file)
	if err != nil {
		return "", err
	}
	a, err := parseWhatIfArgs([]string{"-rules", file, "-from", span}, env.Now(), env.Stderr)
	if err != nil {
		return "", fmt.Errorf("-whatif: %w", err)
	}
	cfg, err := ConfigFromEnv(env.Getenv)
	if err != nil {
		return "", fmt.Errorf("config: %w", err)
	}
	rep, err := replayWhatIf(ctx, env, cfg, a, candidate, baseline, baselineName)
	if errors.Is(err, whatif.ErrTooMany) {
		return "", fmt.Errorf("what-if gate: the last %s holds more than %d decisions: give a shorter -whatif (or -whatif 0 to skip the gate): %w", span, a.maxEvents, err)
	}
	if err != nil {
		return "", fmt.Errorf("what-if gate: %w", err)
	}
	verdict := fmt.Sprintf("what-if over the last %s: %s, confidence %s, %d decisions replayed", span, rep.Verdict, rep.Confidence, rep.Replayed)
	fmt.Fprintln(env.Stdout, verdict)
	for _, r := range rep.Reasons {
		fmt.Fprintln(env.Stdout, "  "+r)
	}
	if rep.Verdict == whatif.VerdictReject {
		return "", fmt.Errorf("%s: the rollout is refused, nothing was published (limiter whatif shows the report; -whatif 0 skips the gate)", verdict)
	}
	return verdict, nil
}

// statusCmd prints the state of the rules topic and the live impact.
func statusCmd(ctx context.Context, env service.Env, args []string) error {
	if len(args) > 0 {
		return fmt.Errorf("status: no arguments\n%s", usage)
	}
	re, err := openRules(ctx, env, false)
	if err != nil {
		return err
	}
	defer re.topic.Close()
	st, err := re.topic.Read(ctx)
	if err != nil {
		return err
	}
	e := config.NewEnv(env.Getenv)
	rdb := redisx.NewClient(redisx.Options{Addrs: e.List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs), DialTimeout: time.Second,
		Security: config.ReadRedisSecurity(e)})
	defer rdb.Close()
	if err := e.Err(); err != nil {
		return err
	}
	return printStatus(ctx, env.Stdout, &st, func(v int64) (rollout.Impact, error) { return rollout.ReadImpact(ctx, rdb, re.topic.Name, v) }, time.Now())
}

func printStatus(_ context.Context, out io.Writer, st *rollout.State, impact func(int64) (rollout.Impact, error), now time.Time) error {
	w := tabwriter.NewWriter(out, 0, 4, 2, ' ', 0)
	enf, ok := st.Enforced()
	if !ok {
		fmt.Fprintln(w, "enforced:\tnone on the topic (replicas serve their file or built-in rules)")
	} else {
		fmt.Fprintf(w, "enforced:\tversion %d since %s by %s: %s\n", enf.Version, enf.TS.Format(time.RFC3339), enf.Author, enf.Reason)
		if rollout.Watching(enf, now) {
			fmt.Fprintf(w, "watch:\tuntil %s, rolled back above %.1f %% CRITICAL blocked\n", enf.TS.Add(enf.WatchFor()).Format(time.RFC3339), 100*enf.MaxShare())
			if err := printImpact(w, impact, enf.Version, rollout.PhaseEnforced); err != nil {
				return err
			}
		}
	}
	if c, ok := st.Candidate(); ok {
		fmt.Fprintf(w, "candidate:\tversion %d, %s since %s by %s: %s\n", c.Version, c.StepName(), c.TS.Format(time.RFC3339), c.Author, c.Reason)
		if c.Step == 0 {
			fmt.Fprintf(w, "shadow:\tuntil %s, aborted above %.1f %% CRITICAL would-block (after %d CRITICAL decisions)\n",
				c.TS.Add(c.ShadowFor()).Format(time.RFC3339), 100*c.MaxShare(), c.MinSamples())
		} else {
			fmt.Fprintf(w, "step:\tenforced for %.2f %% of principals, watched until %s; rolled back on harm to version %d\n",
				float64(c.SliceBP())/100, c.TS.Add(c.StepWindow()).Format(time.RFC3339), c.ParentVersion)
		}
		if c.Whatif != "" {
			fmt.Fprintf(w, "first gate:\t%s\n", c.Whatif)
		}
		if c.Steps != "" {
			fmt.Fprintf(w, "steps:\t%s %% of principals, each watched %s\n", c.Steps, c.StepWindow())
		}
		if err := printImpact(w, impact, c.Version, rollout.PhaseShadow); err != nil {
			return err
		}
		d := rollout.Diff(enf.Rules, c.Rules)
		add, rm := rollout.DiffStat(d)
		fmt.Fprintf(w, "diff:\t+%d -%d lines against version %d\n", add, rm, enf.Version)
		w.Flush()
		fmt.Fprint(out, rollout.FormatDiff(d))
	} else {
		fmt.Fprintln(w, "candidate:\tnone")
	}
	fmt.Fprintln(w, "\nversion\tstate\tsince\tby\treason")
	for i, v := range st.Versions() {
		if i == 10 {
			break
		}
		fmt.Fprintf(w, "%d\t%s\t%s\t%s\t%s\n", v.Version, v.State, v.TS.Format(time.RFC3339), v.Author, strings.ReplaceAll(v.Reason, "\n", " "))
	}
	return w.Flush()
}

func printImpact(w io.Writer, impact func(int64) (rollout.Impact, error), v int64, phase string) error {
	im, err := impact(v)
	if err != nil {
		return fmt.Errorf("live impact: %w", err)
	}
	c, verb := im.Enforced, "blocked"
	if phase == rollout.PhaseShadow {
		c, verb = im.Shadow, "would block"
	}
	for _, p := range rollout.Priorities {
		fmt.Fprintf(w, "  %s:\t%d of %d %s (%.1f %%)\n", p, c.Blocked[p], c.Total[p], verb, 100*c.Share(p))
	}
	if c.Errors > 0 {
		fmt.Fprintf(w, "  not judged:\t%d (Redis)\n", c.Errors)
	}
	return nil
}
