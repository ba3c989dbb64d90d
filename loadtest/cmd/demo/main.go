// Command demo runs the whole Floodgate pipeline on the local stack and
// narrates it: it starts the limiter, the detector, the quota ledger (with
// its usage API), the adjuster, the dlq-auditor and the console, sends traffic
// that looks like people and services (loadtest/traffic.People: Poisson
// sessions, NAT'd users, app pollers, declared bots of several rates) and two
// abusers (a rapid-fire bot, a taken-over account spread over many addresses)
// through the limiter, prints decisions per second and each detection with its
// evidence, and shows the other services at work: the quota ledger counting a
// principal (its usage API), the adjuster's ticks (its /v1/status) and a
// malformed event it sends on purpose reaching the dlq-auditor as a dead
// letter. The console is browsable while the demo runs, with a demo analyst
// and a demo SRE whose passwords (random, made for the run) are printed with
// its URL. It ends (or, on Ctrl-C, stops) with a summary: legitimate
// principals penalized (should be 0), abusers caught, and what the other
// services did; with -stay (the default) everything keeps running until
// Ctrl-C, which stops everything it started.
//
// Tokens, passwords and the session secret are made per run and their hashes
// live in files under -logs that are removed at the end; the adjuster writes
// its scales to Redis keys of its own run (the limiter's fg:scales, shared
// with the rest of the stack, is left alone).
//
// `make demo` brings the stack up, migrates and builds first.
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cli"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/loadtest/bench"
	"github.com/floodgate-dev/floodgate/loadtest/traffic"
	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

func main() {
	cli.Main(nil, "demo", func(ctx context.Context) error {
		_, err := run(ctx, os.Args[1:], os.Getenv, os.Stdout)
		return err
	})
}

// summary is what the demo found at the end: legitimate principals with a
// penalty or an abuse event (there should be none), abusers caught, and what
// the services behind the detector did.
type summary struct {
	Legit, LegitPenalized  int
	Abusive, AbusersCaught int
	LegitPenalizedIDs      []string
	AbusersMissed          []string

	QuotaPrincipal string   // whose usage the demo read from the quota usage API
	QuotaUnits     int64    // its units today, read after the traffic
	AdjusterTicks  int      // adjuster ticks seen in its /v1/status
	AdjusterFresh  []string // the signals the adjuster read fresh at a tick (sorted)
	DeadLetters    []string // the dlq-auditor's records of the demo's dead letter
	ConsoleURL     string
}

// services are the binaries the demo starts, in order.
var services = []string{"limiter", "detector", "quota", "adjuster", "dlq-auditor", "console"}

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) (summary, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	duration := fs.Duration("duration", 60*time.Second, "how long to send traffic (Ctrl-C stops earlier)")
	humans := fs.Int("humans", 30, "people on their own addresses (Poisson sessions)")
	nat := fs.Int("nat", 20, "people behind one carrier NAT (2 addresses)")
	pollers := fs.Int("pollers", 10, "apps polling every 2–10 s")
	botRate := fs.Float64("bot-rate", 300, "checks per second of the rapid-fire bot")
	binDir := fs.String("bin", ".local/bin", "where `make build` put the services")
	telegrafBin := fs.String("telegraf", ".local/bin/telegraf", "Telegraf, writing this host's cpu and mem for the adjuster as on a fleet's hosts (`deploy/local/stack.sh install telegraf` builds it)")
	telegrafConf := fs.String("telegraf-config", "deploy/telegraf/telegraf.conf", "the configuration Telegraf runs with")
	logDir := fs.String("logs", ".local/log", "where service logs go")
	limiterAddr := fs.String("limiter-addr", "127.0.0.1:8080", "the limiter's HTTP address")
	detectorAddr := fs.String("detector-addr", "127.0.0.1:8082", "the detector's HTTP address")
	adjusterAddr := fs.String("adjuster-addr", "127.0.0.1:8083", "the adjuster's HTTP address (admin API)")
	dlqAddr := fs.String("dlq-addr", "127.0.0.1:8084", "the dlq-auditor's HTTP address")
	quotaAddr := fs.String("quota-addr", "127.0.0.1:8085", "the quota ledger's HTTP address (usage API)")
	consoleAddr := fs.String("console-addr", "127.0.0.1:8090", "the console's address (loopback: plain HTTP)")
	stay := fs.Bool("stay", true, "after the summary keep everything running (the console browsable) until Ctrl-C")
	topics := fs.String("topics", "", "use topics <prefix>.decisions, <prefix>.abuse and <prefix>.adjustments (created) instead of the defaults")
	if err := fs.Parse(args); err != nil {
		return summary{}, err
	}
	for _, a := range []struct{ flag, addr string }{{"limiter-addr", *limiterAddr}, {"detector-addr", *detectorAddr},
		{"adjuster-addr", *adjusterAddr}, {"dlq-addr", *dlqAddr}, {"quota-addr", *quotaAddr}, {"console-addr", *consoleAddr}} {
		if err := loopbackAddr(a.addr); err != nil {
			return summary{}, fmt.Errorf("-%s: %w", a.flag, err)
		}
	}
	runID := time.Now().UTC().Format("150405")
	env := config.NewEnv(getenv)
	brokers := env.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers)
	redisAddrs := env.List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs)
	// The services it starts inherit the environment, FLOODGATE_KAFKA_TLS and
	// FLOODGATE_REDIS_PASSWORD included; the demo's own clients use them too.
	kafkaSec, redisSec := config.ReadKafkaSecurity(env), config.ReadRedisSecurity(env)
	if err := env.Err(); err != nil {
		return summary{}, err
	}
	ksec, err := stream.Secure(ctx, brokers, kafkaSec, 10*time.Second, slog.Default())
	if err != nil {
		return summary{}, fmt.Errorf("kafka: %w", err)
	}
	// The local stack's DynamoDB Local unless told otherwise.
	dynamoEnv := "FLOODGATE_DYNAMODB_ENDPOINT=" + env.String("FLOODGATE_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000")
	decisionsTopic, abuseTopic, adjustmentsTopic := config.DefaultDecisionsTopic, config.DefaultAbuseTopic, config.DefaultAdjustmentsTopic
	if *topics != "" {
		decisionsTopic, abuseTopic, adjustmentsTopic = *topics+".decisions", *topics+".abuse", *topics+".adjustments"
		var specs []migrations.TopicSpec
		for _, t := range []string{decisionsTopic, abuseTopic, adjustmentsTopic} {
			specs = append(specs, migrations.TopicSpec{Name: t, Partitions: 3}, migrations.TopicSpec{Name: t + ".dlq", Partitions: 1})
		}
		if err := migrations.NewKafka(brokers, 1, ksec).Apply(ctx, specs, func(string) {}); err != nil {
			return summary{}, fmt.Errorf("create topics: %w", err)
		}
	}
	topicEnv := []string{"FLOODGATE_DECISIONS_TOPIC=" + decisionsTopic, "FLOODGATE_ABUSE_TOPIC=" + abuseTopic, "FLOODGATE_ADJUSTMENTS_TOPIC=" + adjustmentsTopic}

	// Tokens, passwords and the session secret for this run only; the files
	// with their hashes go when the demo stops.
	sec, err := newSecrets()
	if err != nil {
		return summary{}, err
	}
	if err := os.MkdirAll(*logDir, 0o755); err != nil {
		return summary{}, err
	}
	usersFile := filepath.Join(*logDir, "demo-console-users-"+runID+".yaml")
	dlqTokensFile := filepath.Join(*logDir, "demo-dlq-tokens-"+runID)
	defer os.Remove(usersFile)
	defer os.Remove(dlqTokensFile)
	if err := writeUsersFile(filepath.Join(*binDir, "console"), usersFile, sec.Accounts); err != nil {
		return summary{}, fmt.Errorf("%w (run `make build`)", err)
	}
	if err := os.WriteFile(dlqTokensFile, []byte(httpapi.TokenSpecEntry("console", "sre", sec.DLQToken)+"\n"), 0o600); err != nil {
		return summary{}, err
	}
	// The adjuster's scales and shed level go to keys of this run: the
	// limiter's fg:scales is shared with everything else on the stack.
	scalesKey, shedKey := "fg:demo:"+runID+":scales", "fg:demo:"+runID+":shed"
	defer func() {
		rdb := redisx.NewClient(redisx.Options{Addrs: redisAddrs, DialTimeout: time.Second, Security: redisSec})
		_ = rdb.Del(context.WithoutCancel(ctx), scalesKey, shedKey).Err()
		_ = rdb.Close()
	}()
	// The quota ledger's and the dlq-auditor's groups are new each run; they
	// start at the end of their topics, like the detector's, so they read this
	// run's traffic only.
	quotaGroup, dlqGroup := "demo-quota-"+runID, "demo-dlq-auditor-"+runID
	if err := startGroupsAtEnd(ctx, ksec, brokers, quotaGroup, []string{decisionsTopic}); err != nil {
		return summary{}, err
	}
	dlqs, err := dlqTopics(ctx, ksec, brokers)
	if err != nil {
		return summary{}, err
	}
	if err := startGroupsAtEnd(ctx, ksec, brokers, dlqGroup, dlqs); err != nil {
		return summary{}, err
	}

	// Telegraf, as on the hosts of the fleet Floodgate protects: this host's
	// cpu and mem, tagged with this run's fleet, which the adjuster reads.
	fleet := "demo-" + runID
	telegraf, err := startService(*telegrafBin, filepath.Join(*logDir, "demo-telegraf.log"), []string{"FLOODGATE_TELEGRAF_FLEET=" + fleet,
		"FLOODGATE_TELEGRAF_INTERVAL=5s", "FLOODGATE_INFLUX_URL=" + env.String("FLOODGATE_INFLUX_URL", config.DefaultInfluxURL),
		"FLOODGATE_INFLUX_BUCKET=" + env.String("FLOODGATE_INFLUX_BUCKET", config.DefaultInfluxBucket)}, "--strict-env-handling", "--config", *telegrafConf)
	if err != nil {
		return summary{}, fmt.Errorf("%w (deploy/local/stack.sh install telegraf builds it)", err)
	}
	defer cli.StopAll([]*exec.Cmd{telegraf}, 15*time.Second)

	pager, pagerURL, pages := pagerReceiver()
	defer pager.Close()
	procs := []*exec.Cmd{}
	defer func() { stopAll(procs, out) }()
	for _, svc := range []struct {
		name string
		env  []string
	}{
		// One 50/s bucket per principal keeps the story readable: 50 → 5 under the penalty.
		{"limiter", append([]string{"FLOODGATE_LIMITER_ADDR=" + *limiterAddr, "FLOODGATE_LIMITER_GRPC_ADDR=off", "FLOODGATE_GATEWAY=demo",
			"FLOODGATE_LIMITER_PRINCIPAL_LIMIT=50", "FLOODGATE_JOURNAL_DIR=" + filepath.Join(*logDir, "demo-journal-"+runID)}, topicEnv...)},
		{"detector", append([]string{
			// Fresh groups that start at the end of the topics: the demo shows live
			// traffic only, whatever history earlier runs or benchmarks left there.
			// The detector otherwise runs with its defaults.
			"FLOODGATE_DETECTOR_ADDR=" + *detectorAddr, "FLOODGATE_DETECTOR_GROUP=demo-detector-" + runID,
			"FLOODGATE_PAGER_GROUP=demo-pager-" + runID, "FLOODGATE_DETECTOR_START_OFFSET=last", "FLOODGATE_DETECTOR_PENALTY_TTL=2m",
			"FLOODGATE_PAGERDUTY_ROUTING_KEY=demo", "FLOODGATE_PAGERDUTY_URL=" + pagerURL, dynamoEnv,
		}, topicEnv...)},
		{"quota", append([]string{"FLOODGATE_QUOTA_ADDR=" + *quotaAddr, "FLOODGATE_QUOTA_GROUP=" + quotaGroup,
			"FLOODGATE_QUOTA_TOKENS=console:reader:" + httpapi.HashToken(sec.QuotaToken), dynamoEnv}, topicEnv...)},
		{"adjuster", append([]string{"FLOODGATE_ADJUSTER_ADDR=" + *adjusterAddr, "FLOODGATE_ADJUSTER_TOKENS=console:sre:" + httpapi.HashToken(sec.AdjusterToken),
			"FLOODGATE_ADJUSTER_HOST_TAGS=fleet=" + fleet,
			"FLOODGATE_ADJUSTER_SCALES_KEY=" + scalesKey, "FLOODGATE_ADJUSTER_SHED_KEY=" + shedKey, dynamoEnv}, topicEnv...)},
		{"dlq-auditor", []string{"FLOODGATE_DLQ_ADDR=" + *dlqAddr, "FLOODGATE_DLQ_GROUP=" + dlqGroup, "FLOODGATE_DLQ_TOKENS_FILE=" + dlqTokensFile, dynamoEnv}},
		{"console", append([]string{"FLOODGATE_CONSOLE_ADDR=" + *consoleAddr, "FLOODGATE_CONSOLE_USERS=" + usersFile,
			"FLOODGATE_CONSOLE_SESSION_SECRET=" + sec.SessionSecret, "FLOODGATE_CONSOLE_SCALES_KEY=" + scalesKey,
			"FLOODGATE_CONSOLE_QUOTA_URL=http://" + *quotaAddr, "FLOODGATE_CONSOLE_QUOTA_TOKEN=" + sec.QuotaToken,
			"FLOODGATE_CONSOLE_ADJUSTER_URL=http://" + *adjusterAddr, "FLOODGATE_CONSOLE_ADJUSTER_TOKEN=" + sec.AdjusterToken,
			"FLOODGATE_CONSOLE_DLQ_URL=http://" + *dlqAddr, "FLOODGATE_CONSOLE_DLQ_TOKEN=" + sec.DLQToken, dynamoEnv}, topicEnv...)},
	} {
		cmd, err := startService(filepath.Join(*binDir, svc.name), filepath.Join(*logDir, "demo-"+svc.name+".log"), svc.env)
		if err != nil {
			return summary{}, err
		}
		procs = append(procs, cmd)
	}
	for i, addr := range []string{*limiterAddr, *detectorAddr, *quotaAddr, *adjusterAddr, *dlqAddr, *consoleAddr} {
		if err := bench.WaitReady(ctx, "http://"+addr+"/readyz", 30*time.Second); err != nil {
			return summary{}, fmt.Errorf("%s: %w (log: %s)", services[i], err, filepath.Join(*logDir, "demo-"+services[i]+".log"))
		}
	}
	// The detector's group starts at the topic's end once it owns its
	// partitions; give it (and the quota ledger's group) that moment before
	// traffic starts.
	time.Sleep(3 * time.Second)
	actors := traffic.People(*humans, *nat, *pollers, *botRate, runID)
	consoleURL := "http://" + *consoleAddr
	fmt.Fprintf(out, "limiter %s, detector %s, quota %s, adjuster %s, dlq-auditor %s; logs in %s\n",
		*limiterAddr, *detectorAddr, *quotaAddr, *adjusterAddr, *dlqAddr, *logDir)
	printConsole(out, consoleURL, sec.Accounts)
	fmt.Fprintf(out, "traffic for %s (Ctrl-C to stop): %d people (Poisson sessions), %d behind one NAT, %d app pollers, declared bots at 2/5/10/20 checks/s;\n"+
		"abusers: a rapid-fire bot at %.0f checks/s and a taken-over account spread over 200 addresses\n", *duration, *humans, *nat, *pollers, *botRate)

	// A malformed event on the decisions topic, on purpose: the detector and
	// the quota ledger dead-letter it and the dlq-auditor records it.
	deadLetterKey := "demo-dead-letter-" + runID
	start := time.Now()
	if err := sendDeadLetter(ctx, ksec, brokers, decisionsTopic, deadLetterKey); err != nil {
		return summary{}, fmt.Errorf("send the demo dead letter: %w", err)
	}
	fmt.Fprintf(out, "sent a demo dead letter (a malformed event, key %s) to %s: its consumers dead-letter it\n\n", deadLetterKey, decisionsTopic)

	abuse := make(chan events.Abuse, 64)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchAbuse(watchCtx, brokers, ksec, abuseTopic, abuse)
	detected := map[string]events.Abuse{}
	// The quota ledger is read for the declared bot at 20 checks/s: steady and never limited.
	watched := actors[slices.IndexFunc(actors, func(a traffic.Actor) bool { return a.Class == "declared bot" && a.Pace == traffic.Paced{Rate: 20} })]
	obs := &observer{client: &http.Client{Timeout: 5 * time.Second},
		quotaURL: "http://" + *quotaAddr, adjusterURL: "http://" + *adjusterAddr, dlqURL: "http://" + *dlqAddr,
		quotaToken: sec.QuotaToken, adjusterToken: sec.AdjusterToken, dlqToken: sec.DLQToken,
		principalKind: watched.Kind, principalID: watched.ID, decisionsTopic: decisionsTopic,
		deadLetterKey: deadLetterKey, since: start.Add(-time.Minute)}
	notes := make(chan note, 16)
	go obs.watch(watchCtx, 2*time.Second, notes)
	sum := summary{QuotaPrincipal: watched.Kind + ":" + watched.ID, ConsoleURL: consoleURL}
	record := func(n note) {
		fmt.Fprintf(out, "      %s\n", n.line)
		switch {
		case n.quotaUnits > 0:
			sum.QuotaUnits = n.quotaUnits
		case !n.adjusterTick.IsZero():
			sum.AdjusterTicks++
			for _, sig := range n.fresh {
				if !slices.Contains(sum.AdjusterFresh, sig) {
					sum.AdjusterFresh = append(sum.AdjusterFresh, sig)
				}
			}
			slices.Sort(sum.AdjusterFresh)
		case n.deadLetter != "":
			sum.DeadLetters = append(sum.DeadLetters, n.deadLetter)
		}
	}

	trafficCtx, stopTraffic := context.WithTimeout(ctx, *duration)
	defer stopTraffic()
	runner := traffic.NewRunner("http://" + *limiterAddr)
	done := make(chan struct{})
	go func() { runner.Run(trafficCtx, actors); close(done) }()

	classes := []string{"human", "nat", "poller", "declared bot", "rapid-fire bot", "taken-over account"}
	prev := map[string][2]int64{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	fmt.Fprintf(out, "%5s |", "t")
	for _, c := range classes {
		fmt.Fprintf(out, " %18s |", c)
	}
	fmt.Fprintf(out, " %s\n", "ok/blocked per second; bot limit, penalty")
loop:
	for {
		select {
		case <-done:
			break loop
		case a := <-abuse:
			detected[a.Principal.Key()] = a
			printAbuse(out, a)
		case p := <-pages:
			fmt.Fprintf(out, "      >> PagerDuty page: %s\n", p)
		case n := <-notes:
			record(n)
		case <-tick.C:
			fmt.Fprintf(out, "%4.0fs |", time.Since(start).Seconds())
			for _, c := range classes {
				st := runner.Stats(c)
				n := [2]int64{st.Allowed.Load(), st.Denied.Load()}
				fmt.Fprintf(out, " %8d / %-7d |", n[0]-prev[c][0], n[1]-prev[c][1])
				prev[c] = n
			}
			bot := runner.Stats("rapid-fire bot")
			pen := "none"
			if m := bot.Multiplier(); m > 0 && m < 1 {
				pen = fmt.Sprintf("x%.2f", m)
			}
			fmt.Fprintf(out, " %d, %s\n", bot.LastLimit.Load(), pen)
		}
	}
	// Ctrl-C or the end: give the detector and the quota ledger a moment to
	// finish what was sent, then read the penalties in Redis and the usage.
	fmt.Fprintln(out, "\ntraffic stopped; reading penalties")
	sumCtx, cancel := context.WithTimeout(context.WithoutCancel(ctx), 20*time.Second)
	defer cancel()
	drain := time.After(5 * time.Second)
wait:
	for {
		select {
		case a := <-abuse:
			detected[a.Principal.Key()] = a
			printAbuse(out, a)
		case n := <-notes:
			record(n)
		case <-drain:
			break wait
		}
	}
	if units, err := obs.quotaToday(sumCtx); err == nil {
		sum.QuotaUnits = units
	} else {
		fmt.Fprintf(out, "  quota usage API: %v\n", err)
	}
	pen, err := summarize(sumCtx, redisAddrs, redisSec, actors, detected)
	if err != nil {
		return sum, err
	}
	sum.Legit, sum.LegitPenalized, sum.Abusive, sum.AbusersCaught = pen.Legit, pen.LegitPenalized, pen.Abusive, pen.AbusersCaught
	sum.LegitPenalizedIDs, sum.AbusersMissed = pen.LegitPenalizedIDs, pen.AbusersMissed
	fmt.Fprintf(out, "\nsummary: legitimate principals penalized %d of %d; abusers caught %d of %d\n", sum.LegitPenalized, sum.Legit, sum.AbusersCaught, sum.Abusive)
	if len(sum.LegitPenalizedIDs) > 0 {
		fmt.Fprintf(out, "  legitimate principals penalized: %s\n", strings.Join(sum.LegitPenalizedIDs, ", "))
	}
	if len(sum.AbusersMissed) > 0 {
		fmt.Fprintf(out, "  abusers missed: %s\n", strings.Join(sum.AbusersMissed, ", "))
	}
	for _, c := range classes {
		st := runner.Stats(c)
		fmt.Fprintf(out, "  %-18s %d allowed, %d blocked, %d errors\n", c, st.Allowed.Load(), st.Denied.Load(), st.Errors.Load())
	}
	fmt.Fprintf(out, "  %-18s %s: %d units today (its usage API)\n", "quota ledger", sum.QuotaPrincipal, sum.QuotaUnits)
	fmt.Fprintf(out, "  %-18s %d tick(s) seen in /v1/status (one every 30 s; scales in %s); signals read fresh: %s (cpu and mem from Telegraf, fleet %s)\n",
		"adjuster", sum.AdjusterTicks, scalesKey, strings.Join(sum.AdjusterFresh, ", "), fleet)
	fmt.Fprintf(out, "  %-18s %d record(s) of the demo dead letter %s\n", "dlq-auditor", len(sum.DeadLetters), strings.Join(sum.DeadLetters, ", "))
	if *stay && ctx.Err() == nil {
		fmt.Fprintln(out, "\neverything keeps running for you to browse; Ctrl-C stops it")
		printConsole(out, consoleURL, sec.Accounts)
		<-ctx.Done()
		fmt.Fprintln(out)
	}
	return sum, nil
}

// printConsole prints where the console is and how to sign in.
func printConsole(out io.Writer, url string, accounts []account) {
	fmt.Fprintf(out, "console: %s  (accounts and passwords for this run only)\n", url)
	for _, a := range accounts {
		fmt.Fprintf(out, "  %-8s user %-13s password %s\n", a.Role, a.Name, a.Password)
	}
}

// loopbackAddr requires a free host:port on a loopback address: the services
// the demo starts speak plain HTTP and the console's accounts are printed.
func loopbackAddr(addr string) error {
	host, _, err := net.SplitHostPort(addr)
	if err != nil {
		return fmt.Errorf("%q is not host:port", addr)
	}
	if ip := net.ParseIP(host); host != "localhost" && (ip == nil || !ip.IsLoopback()) {
		return fmt.Errorf("%q: the demo binds loopback addresses only", addr)
	}
	// Taken, the service would not start while whatever holds the port
	// answers the demo's readiness checks.
	ln, err := net.Listen("tcp", addr)
	if err != nil {
		return fmt.Errorf("%s is in use (another Floodgate service?); choose another address", addr)
	}
	return ln.Close()
}

// summarize reads each actor's penalty key in Redis; a legitimate actor with
// a penalty or an abuse event counts as penalized.
func summarize(ctx context.Context, addrs []string, sec config.RedisSecurity, actors []traffic.Actor, detected map[string]events.Abuse) (summary, error) {
	rdb := redisx.NewClient(redisx.Options{Addrs: addrs, DialTimeout: time.Second, Security: sec})
	defer rdb.Close()
	var s summary
	for _, a := range actors {
		n, err := rdb.Exists(ctx, redisx.PenaltyKey(a.Kind, a.ID)).Result()
		if err != nil {
			return s, fmt.Errorf("read penalty of %s:%s: %w", a.Kind, a.ID, err)
		}
		_, hit := detected[a.Kind+":"+a.ID]
		name := a.Kind + ":" + a.ID + " (" + a.Class + ")"
		if a.Abusive {
			s.Abusive++
			if n == 1 {
				s.AbusersCaught++
			} else {
				s.AbusersMissed = append(s.AbusersMissed, name)
			}
			continue
		}
		s.Legit++
		if n == 1 || hit {
			s.LegitPenalized++
			s.LegitPenalizedIDs = append(s.LegitPenalizedIDs, name)
		}
	}
	return s, nil
}

func printAbuse(out io.Writer, a events.Abuse) {
	fmt.Fprintf(out, "\n  ** %s detected: %s (severity %s, score %.1f)\n", a.Pattern, a.Principal.Key(), a.Severity, a.Score)
	fmt.Fprintf(out, "     evidence: %s; %d events; first event %s\n", a.EvidenceSummary(), a.Evidence.EventCount,
		events.FormatTime(a.FirstEventAt))
	for _, r := range a.Evidence.TopRoutes {
		fmt.Fprintf(out, "     route %-40s %d\n", r.Route, r.Count)
	}
	fmt.Fprintf(out, "     penalty: limits x%.2f, level %d, %s, until %s\n", a.Penalty.Multiplier, a.Penalty.Level, a.Penalty.Mode,
		events.FormatTime(a.Penalty.ExpiresAt))
	if a.Penalty.Reason != "" {
		fmt.Fprintf(out, "     response: %s\n", a.Penalty.Reason)
	}
	fmt.Fprintln(out)
}

// watchAbuse reads new abuse events from every partition of the abuse topic.
func watchAbuse(ctx context.Context, brokers []string, sec *stream.Security, topic string, out chan<- events.Abuse) {
	dialer := sec.Dialer()
	conn, err := dialer.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		slog.Warn("watch abuse topic", "err", err)
		return
	}
	parts, err := conn.ReadPartitions(topic)
	conn.Close()
	if err != nil {
		slog.Warn("watch abuse topic", "err", err)
		return
	}
	for _, p := range parts {
		go func() {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Dialer: dialer, Topic: topic, Partition: p.ID, MaxWait: 250 * time.Millisecond})
			defer r.Close()
			_ = r.SetOffset(kafka.LastOffset)
			for {
				m, err := r.ReadMessage(ctx) // a partition reader without a group: nothing is committed
				if err != nil {
					return
				}
				if a, err := events.DecodeAbuse(m.Value); err == nil {
					select {
					case out <- a:
					case <-ctx.Done():
						return
					}
				}
			}
		}()
	}
}

// pagerReceiver stands in for PagerDuty's Events API and reports each page's summary.
func pagerReceiver() (*http.Server, string, <-chan string) {
	pages := make(chan string, 16)
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	srv := &http.Server{Handler: http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		var ev struct {
			Action   string `json:"event_action"`
			DedupKey string `json:"dedup_key"`
			Payload  struct {
				Summary string `json:"summary"`
			} `json:"payload"`
		}
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ev)
		page := ev.Payload.Summary
		if ev.Action != "trigger" { // a resolve or an acknowledge carries no payload
			page = ev.Action + " " + ev.DedupKey
		}
		select {
		case pages <- page:
		default:
		}
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"status":"success","dedup_key":"`+ev.DedupKey+`"}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	return srv, "http://" + ln.Addr().String(), pages
}

func startService(path, logPath string, env []string, args ...string) (*exec.Cmd, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (run `make build`): %w", path, err)
	}
	return cmd, nil
}

func stopAll(procs []*exec.Cmd, out io.Writer) {
	cli.StopAll(procs, 15*time.Second)
	fmt.Fprintf(out, "stopped %d services: %s\n", len(procs), strings.Join(services[:len(procs)], ", "))
}
