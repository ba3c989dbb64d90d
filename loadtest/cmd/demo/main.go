// Command demo runs the Floodgate pipeline on the local stack and narrates it:
// it starts the limiter and the detector, sends traffic that looks like people
// and services (loadtest/traffic.People: Poisson sessions, NAT'd users, app
// pollers, declared bots of several rates) and two abusers (a rapid-fire bot, a
// taken-over account spread over many addresses) through the limiter, prints
// decisions per second and each detection with its evidence, and ends (or, on
// Ctrl-C, stops) with a summary: legitimate principals penalized (should be 0)
// and abusers caught. Ctrl-C stops everything it started.
//
// `make demo` brings the stack up, migrates and builds first.
package main

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/loadtest/traffic"
	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, os.Args[1:], os.Getenv, os.Stdout); err != nil {
		slog.Error("demo", "err", err)
		os.Exit(1)
	}
}

// summary is what the demo found at the end: legitimate principals with a
// penalty or an abuse event (there should be none) and abusers caught.
type summary struct {
	Legit, LegitPenalized  int
	Abusive, AbusersCaught int
	LegitPenalizedIDs      []string
	AbusersMissed          []string
}

func run(ctx context.Context, args []string, getenv func(string) string, out io.Writer) (summary, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	duration := fs.Duration("duration", 60*time.Second, "how long to send traffic (Ctrl-C stops earlier)")
	humans := fs.Int("humans", 30, "people on their own addresses (Poisson sessions)")
	nat := fs.Int("nat", 20, "people behind one carrier NAT (2 addresses)")
	pollers := fs.Int("pollers", 10, "apps polling every 2–10 s")
	botRate := fs.Float64("bot-rate", 300, "checks per second of the rapid-fire bot")
	binDir := fs.String("bin", ".local/bin", "where `make build` put the services")
	logDir := fs.String("logs", ".local/log", "where service logs go")
	limiterAddr := fs.String("limiter-addr", "127.0.0.1:8080", "the limiter's HTTP address")
	detectorAddr := fs.String("detector-addr", "127.0.0.1:8082", "the detector's HTTP address")
	topics := fs.String("topics", "", "use topics <prefix>.decisions and <prefix>.abuse (created) instead of the defaults")
	if err := fs.Parse(args); err != nil {
		return summary{}, err
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
	decisionsTopic, abuseTopic := config.DefaultDecisionsTopic, config.DefaultAbuseTopic
	if *topics != "" {
		decisionsTopic, abuseTopic = *topics+".decisions", *topics+".abuse"
		var specs []migrations.TopicSpec
		for _, t := range []string{decisionsTopic, abuseTopic} {
			specs = append(specs, migrations.TopicSpec{Name: t, Partitions: 3}, migrations.TopicSpec{Name: t + ".dlq", Partitions: 1})
		}
		if err := migrations.NewKafka(brokers, 1, ksec).Apply(ctx, specs, func(string) {}); err != nil {
			return summary{}, fmt.Errorf("create topics: %w", err)
		}
	}
	topicEnv := []string{"FLOODGATE_DECISIONS_TOPIC=" + decisionsTopic, "FLOODGATE_ABUSE_TOPIC=" + abuseTopic}

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
			"FLOODGATE_PAGERDUTY_ROUTING_KEY=demo", "FLOODGATE_PAGERDUTY_URL=" + pagerURL,
			// The local stack's DynamoDB Local unless told otherwise.
			"FLOODGATE_DYNAMODB_ENDPOINT=" + env.String("FLOODGATE_DYNAMODB_ENDPOINT", "http://127.0.0.1:8000"),
		}, topicEnv...)},
	} {
		cmd, err := startService(filepath.Join(*binDir, svc.name), filepath.Join(*logDir, "demo-"+svc.name+".log"), svc.env)
		if err != nil {
			return summary{}, err
		}
		procs = append(procs, cmd)
	}
	for _, url := range []string{"http://" + *limiterAddr + "/readyz", "http://" + *detectorAddr + "/readyz"} {
		if err := waitReady(ctx, url); err != nil {
			return summary{}, fmt.Errorf("%w (logs in %s)", err, *logDir)
		}
	}
	// The detector's group starts at the topic's end once it owns its
	// partitions; give it that moment before traffic starts.
	time.Sleep(3 * time.Second)
	actors := traffic.People(*humans, *nat, *pollers, *botRate, runID)
	fmt.Fprintf(out, "limiter on %s, detector on %s; logs in %s\n", *limiterAddr, *detectorAddr, *logDir)
	fmt.Fprintf(out, "traffic for %s (Ctrl-C to stop): %d people (Poisson sessions), %d behind one NAT, %d app pollers, declared bots at 2/5/10/20 checks/s;\n"+
		"abusers: a rapid-fire bot at %.0f checks/s and a taken-over account spread over 200 addresses\n\n", *duration, *humans, *nat, *pollers, *botRate)

	abuse := make(chan events.Abuse, 64)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchAbuse(watchCtx, brokers, ksec, abuseTopic, abuse)
	detected := map[string]events.Abuse{}

	trafficCtx, stopTraffic := context.WithTimeout(ctx, *duration)
	defer stopTraffic()
	runner := traffic.NewRunner("http://" + *limiterAddr)
	done := make(chan struct{})
	go func() { runner.Run(trafficCtx, actors); close(done) }()

	classes := []string{"human", "nat", "poller", "declared bot", "rapid-fire bot", "taken-over account"}
	prev := map[string][2]int64{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	start := time.Now()
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
	// Ctrl-C or the end: give the detector a moment to finish what was sent,
	// then read the penalties in Redis.
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
		case <-drain:
			break wait
		}
	}
	sum, err := summarize(sumCtx, redisAddrs, redisSec, actors, detected)
	if err != nil {
		return sum, err
	}
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
	return sum, nil
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
	fmt.Fprintf(out, "     evidence: %.1f checks/s vs threshold %.1f/s (window %ds); %d events; %d distinct IPs; first event %s\n",
		a.Evidence.ObservedRate, a.Evidence.Threshold, a.Window.Seconds, a.Evidence.EventCount, a.Evidence.DistinctIPs,
		events.FormatTime(a.FirstEventAt))
	for _, r := range a.Evidence.TopRoutes {
		fmt.Fprintf(out, "     route %-40s %d\n", r.Route, r.Count)
	}
	fmt.Fprintf(out, "     penalty: limits x%.2f, level %d, %s, until %s\n\n", a.Penalty.Multiplier, a.Penalty.Level, a.Penalty.Mode,
		events.FormatTime(a.Penalty.ExpiresAt))
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
			DedupKey string `json:"dedup_key"`
			Payload  struct {
				Summary string `json:"summary"`
			} `json:"payload"`
		}
		_ = json.NewDecoder(io.LimitReader(r.Body, 1<<20)).Decode(&ev)
		select {
		case pages <- ev.Payload.Summary:
		default:
		}
		w.WriteHeader(http.StatusAccepted)
		_, _ = io.WriteString(w, `{"status":"success","dedup_key":"`+ev.DedupKey+`"}`)
	})}
	go func() { _ = srv.Serve(ln) }()
	return srv, "http://" + ln.Addr().String(), pages
}

func startService(path, logPath string, env []string) (*exec.Cmd, error) {
	if err := os.MkdirAll(filepath.Dir(logPath), 0o755); err != nil {
		return nil, err
	}
	logFile, err := os.Create(logPath)
	if err != nil {
		return nil, err
	}
	cmd := exec.Command(path)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logFile, logFile
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("start %s (run `make build`): %w", path, err)
	}
	return cmd, nil
}

func stopAll(procs []*exec.Cmd, out io.Writer) {
	for _, p := range procs {
		_ = p.Process.Signal(syscall.SIGTERM)
	}
	for _, p := range procs {
		done := make(chan struct{})
		go func() { _ = p.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(15 * time.Second):
			_ = p.Process.Kill()
		}
	}
	fmt.Fprintln(out, "stopped the limiter and the detector")
}

func waitReady(ctx context.Context, url string) error {
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if resp, err := http.Get(url); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(200 * time.Millisecond):
		}
	}
	return errors.New(strings.TrimSuffix(url, "/readyz") + " did not become ready within 30s")
}
