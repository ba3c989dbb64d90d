package app

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
)

// whatIfArgs are the flags of `limiter whatif`.
type whatIfArgs struct {
	rules, baseline string
	from, to        time.Time
	format          string
	redis           []string
	top             int
	slack           time.Duration
	maxEvents       int
	thresholds      whatif.Thresholds
}

// parseWhatIfArgs reads the flags; errors name the flag.
func parseWhatIfArgs(args []string, now time.Time, stderr io.Writer) (whatIfArgs, error) {
	var a whatIfArgs
	fs := flag.NewFlagSet("limiter whatif", flag.ContinueOnError)
	fs.SetOutput(stderr)
	fs.StringVar(&a.rules, "rules", "", "candidate rules file (required)")
	fs.StringVar(&a.baseline, "baseline", "", `rules the traffic was recorded under, to recover each request's own cost (default: the limiter's rules, FLOODGATE_LIMITER_RULES or the built-in grid; "none" for none)`)
	from := fs.String("from", "", `start of the range: RFC 3339 (2026-11-27T10:00:00Z) or a duration before now ("1h") (required)`)
	to := fs.String("to", "now", `end of the range (exclusive): RFC 3339, a duration before now, or "now"`)
	fs.StringVar(&a.format, "format", "text", "text or json")
	redisAddrs := fs.String("redis", "", "Redis to replay in (comma-separated; default FLOODGATE_REDIS_ADDRS): a scratch Redis keeps the replay's load off production")
	fs.IntVar(&a.top, "top", 10, "principals and paying plans listed as most affected")
	fs.DurationVar(&a.slack, "slack", 2*time.Minute, "how far a decision's produce time may be from its ts")
	fs.IntVar(&a.maxEvents, "max-events", 2_000_000, "refuse a range holding more decisions than this")
	fs.Float64Var(&a.thresholds.RejectCritical, "reject-critical", 0.05, "reject when the candidate blocks more than this share of the critical traffic that was allowed")
	fs.Float64Var(&a.thresholds.Review, "review", 0.01, "review when it newly blocks more than this share of allowed traffic overall, of a priority or of a paying plan")
	free := fs.String("free-plans", "default,free", "plans that do not pay (comma-separated)")
	if err := fs.Parse(args); err != nil {
		return a, err
	}
	var errs []error
	if fs.NArg() > 0 {
		errs = append(errs, fmt.Errorf("unexpected arguments %q", fs.Args()))
	}
	if a.rules == "" {
		errs = append(errs, errors.New("-rules: required"))
	}
	var err error
	if a.from, err = whatif.ParseTime(*from, now); err != nil {
		errs = append(errs, fmt.Errorf("-from: %w", err))
	}
	if a.to, err = whatif.ParseTime(*to, now); err != nil {
		errs = append(errs, fmt.Errorf("-to: %w", err))
	}
	if err == nil && !a.from.IsZero() && !a.from.Before(a.to) {
		errs = append(errs, fmt.Errorf("-from %s: must be before -to %s", a.from.Format(time.RFC3339), a.to.Format(time.RFC3339)))
	}
	if a.format != "text" && a.format != "json" {
		errs = append(errs, fmt.Errorf("-format %q: want text or json", a.format))
	}
	if *redisAddrs != "" {
		for _, s := range strings.Split(*redisAddrs, ",") {
			if s = strings.TrimSpace(s); s != "" {
				a.redis = append(a.redis, s)
			}
		}
	}
	if a.top < 1 {
		errs = append(errs, fmt.Errorf("-top %d: must be at least 1", a.top))
	}
	if a.slack <= 0 {
		errs = append(errs, fmt.Errorf("-slack %s: must be positive", a.slack))
	}
	if a.maxEvents < 1 {
		errs = append(errs, fmt.Errorf("-max-events %d: must be at least 1", a.maxEvents))
	}
	for _, p := range strings.Split(*free, ",") {
		if p = strings.TrimSpace(p); p != "" {
			a.thresholds.FreePlans = append(a.thresholds.FreePlans, p)
		}
	}
	if a.thresholds.FreePlans == nil {
		a.thresholds.FreePlans = []string{}
	}
	if err := a.thresholds.Validate(); err != nil {
		errs = append(errs, fmt.Errorf("-reject-critical/-review: %w", err))
	}
	return a, errors.Join(errs...)
}

// runWhatIf is `limiter whatif`: it replays the decisions recorded in a range
// through a candidate rules file and prints the report (pkg/whatif,
// docs/whatif.md). It exits with an error when the verdict is reject, so a
// pipeline can gate a rules change on it.
func runWhatIf(ctx context.Context, env service.Env, args []string) error {
	a, err := parseWhatIfArgs(args, env.Now(), env.Stderr)
	if err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return nil
		}
		return fmt.Errorf("usage: limiter whatif -rules FILE -from T [-to T] [flags]: %w", err)
	}
	cfg, err := ConfigFromEnv(env.Getenv)
	if err != nil {
		return fmt.Errorf("config: %w", err)
	}
	candidate, _, err := limiter.LoadRulesFile(a.rules)
	if err != nil {
		return fmt.Errorf("-rules: %w", err)
	}
	var baseline *limiter.Ruleset
	baseName := a.baseline
	switch {
	case a.baseline == "none":
		baseName = ""
	case a.baseline != "":
		if baseline, _, err = limiter.LoadRulesFile(a.baseline); err != nil {
			return fmt.Errorf("-baseline: %w", err)
		}
	case cfg.RulesPath != "":
		baseName = cfg.RulesPath
		if baseline, _, err = limiter.LoadRulesFile(cfg.RulesPath); err != nil {
			return fmt.Errorf("FLOODGATE_LIMITER_RULES: %w", err)
		}
	case cfg.PrincipalLimit > 0:
		baseName, baseline = "FLOODGATE_LIMITER_PRINCIPAL_LIMIT", limiter.SinglePrincipalRules(cfg.PrincipalLimit, cfg.PrincipalPeriod)
	default:
		baseName = "built-in rate-limits.yaml"
		if baseline, err = limiter.ParseRules(baseName, defaultRules); err != nil {
			return err
		}
	}

	rep, err := replayWhatIf(ctx, env, cfg, a, candidate, baseline, baseName)
	if err != nil {
		return err
	}
	if a.format == "json" {
		err = rep.WriteJSON(env.Stdout)
	} else {
		err = rep.WriteText(env.Stdout)
	}
	if err != nil {
		return fmt.Errorf("write the report: %w", err)
	}
	if rep.Verdict == whatif.VerdictReject {
		return errors.New("what-if verdict: reject")
	}
	return nil
}

// replayWhatIf replays the decisions recorded in a's range through candidate
// (baseline: the rules they were recorded under) and returns the report.
func replayWhatIf(ctx context.Context, env service.Env, cfg Config, a whatIfArgs, candidate, baseline *limiter.Ruleset, baseName string) (*whatif.Report, error) {
	addrs := cfg.RedisAddrs
	sentinel := cfg.SentinelMaster
	if len(a.redis) > 0 {
		addrs, sentinel = a.redis, ""
	}
	rdb := redisx.NewClient(redisx.Options{Addrs: addrs, SentinelMaster: sentinel, SentinelAddrs: cfg.SentinelAddrs,
		DialTimeout: time.Second, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second, Security: cfg.RedisSecurity})
	defer rdb.Close()
	pctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	err := redisx.Ping(pctx, rdb)
	cancel()
	if err != nil {
		return nil, fmt.Errorf("redis %v: %w", addrs, err)
	}
	ksec, err := stream.Secure(ctx, cfg.KafkaBrokers, cfg.KafkaSecurity, 5*time.Second, env.Log)
	if err != nil {
		return nil, fmt.Errorf("kafka: %w", err)
	}
	src := &whatif.Source{Client: ksec.Client(cfg.KafkaBrokers, 30*time.Second), Topic: cfg.DecisionsTopic,
		Slack: a.slack, MaxEvents: a.maxEvents}
	rep, err := whatif.Run(ctx, src, a.from, a.to, whatif.Config{Redis: rdb, Candidate: candidate, Baseline: baseline,
		Thresholds: a.thresholds, Top: a.top, Logger: env.Log, CandidateName: a.rules, BaselineName: baseName})
	if err != nil {
		return nil, err
	}
	return rep, nil
}
