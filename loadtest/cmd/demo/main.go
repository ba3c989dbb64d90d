// Command demo runs the Floodgate pipeline on the local stack and narrates it:
// it starts the limiter and the detector, sends traffic that looks like people
// and services (people arriving at random, NAT'd users, app pollers, declared
// bots inside their limits) and two abusers (a spamming bot, an account
// takeover fanning out over new networks) through the limiter, and prints
// decisions per second, each detection with its evidence, and at the end how
// many legitimate principals were penalized (the answer must be 0) and which
// abusers were caught. Ctrl-C stops everything it started.
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
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if _, err := run(ctx, os.Args[1:], os.Stdout); err != nil {
		slog.Error("demo", "err", err)
		os.Exit(1)
	}
}

// summary is what the demo shows at the end.
type summary struct {
	Legit, Abusers              int
	LegitPenalized, AbuseCaught []string
}

func run(ctx context.Context, args []string, out io.Writer) (summary, error) {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	duration := fs.Duration("duration", 60*time.Second, "how long to send traffic (Ctrl-C stops earlier)")
	users := fs.Int("users", 40, "people arriving at random, 0.2–1.5 checks a second each (plus a quarter as many NAT'd users and app pollers)")
	botRate := fs.Float64("bot-rate", 300, "checks per second of the rapid-fire bot")
	binDir := fs.String("bin", ".local/bin", "where `make build` put the services")
	logDir := fs.String("logs", ".local/log", "where service logs go")
	limiterAddr := fs.String("limiter-addr", "127.0.0.1:8080", "the limiter's HTTP address")
	detectorAddr := fs.String("detector-addr", "127.0.0.1:8082", "the detector's HTTP address")
	grpcAddr := fs.String("limiter-grpc-addr", "127.0.0.1:8081", "the limiter's gRPC address")
	if err := fs.Parse(args); err != nil {
		return summary{}, err
	}
	runID := time.Now().UTC().Format("150405")
	brokers := config.NewEnv(os.Getenv).List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers)

	pager, pagerURL, pages := pagerReceiver()
	defer pager.Close()
	procs := []*exec.Cmd{}
	defer func() { stopAll(procs, out) }()
	local := []string{}
	if os.Getenv("FLOODGATE_DYNAMODB_ENDPOINT") == "" { // the demo runs on the local stack, never on AWS
		local = append(local, "FLOODGATE_DYNAMODB_ENDPOINT=http://127.0.0.1:8000")
	}
	for _, svc := range []struct {
		name string
		env  []string
	}{
		// One 50/s bucket per principal keeps the story readable: 50 → 5 under the penalty.
		{"limiter", []string{"FLOODGATE_LIMITER_ADDR=" + *limiterAddr, "FLOODGATE_LIMITER_GRPC_ADDR=" + *grpcAddr, "FLOODGATE_GATEWAY=demo",
			"FLOODGATE_LIMITER_PRINCIPAL_LIMIT=50", "FLOODGATE_JOURNAL_DIR=" + filepath.Join(*logDir, "demo-limiter-journal-"+runID)}},
		{"detector", []string{
			// Fresh groups that start at the end of the topics: the demo shows live
			// traffic only, whatever history earlier runs or benchmarks left there.
			"FLOODGATE_DETECTOR_ADDR=" + *detectorAddr, "FLOODGATE_DETECTOR_GROUP=demo-detector-" + runID,
			"FLOODGATE_PAGER_GROUP=demo-pager-" + runID, "FLOODGATE_DETECTOR_START_OFFSET=last", "FLOODGATE_DETECTOR_WINDOW=10s",
			"FLOODGATE_DETECTOR_RAPID_FIRE_RATE=20", "FLOODGATE_DETECTOR_PENALTY_TTL=2m",
			"FLOODGATE_PAGERDUTY_ROUTING_KEY=demo", "FLOODGATE_PAGERDUTY_URL=" + pagerURL,
		}},
	} {
		cmd, err := startService(filepath.Join(*binDir, svc.name), filepath.Join(*logDir, "demo-"+svc.name+".log"), append(local, svc.env...))
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
	actors := traffic.DemoActors(*users, *botRate, runID)
	fmt.Fprintf(out, "limiter on %s, detector on %s; logs in %s\n", *limiterAddr, *detectorAddr, *logDir)
	fmt.Fprintf(out, "traffic for %s (Ctrl-C to stop): %d people at random times (%d behind one NAT), %d app pollers,\n"+
		"6 declared bots at 2–30 checks/s inside their limits; abusers: a bot at %.0f checks/s, an account taken over after 20 s\n\n",
		*duration, *users+max(*users/4, 1), max(*users/4, 1), max(*users/4, 1), *botRate)

	abuse := make(chan events.Abuse, 16)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchAbuse(watchCtx, brokers, abuse)

	trafficCtx, stopTraffic := context.WithTimeout(ctx, *duration)
	defer stopTraffic()
	runner := traffic.NewRunner("http://" + *limiterAddr)
	done := make(chan struct{})
	go func() { runner.Run(trafficCtx, actors); close(done) }()

	classes := []string{"people", "pollers", "bots", "spammer", "takeover"}
	prev := map[string][2]int64{}
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	start := time.Now()
	fmt.Fprintf(out, "%5s |", "t")
	for _, c := range classes {
		fmt.Fprintf(out, " %-17s |", c+" ok/denied")
	}
	fmt.Fprintf(out, " spammer limit  penalty\n")
	for {
		select {
		case <-done:
			return finish(out, runner, actors, classes), nil
		case a := <-abuse:
			printAbuse(out, a)
		case p := <-pages:
			if p != "" { // resolves carry no summary
				fmt.Fprintf(out, "      >> PagerDuty page: %s\n", p)
			}
		case <-tick.C:
			fmt.Fprintf(out, "%4.0fs |", time.Since(start).Seconds())
			for _, c := range classes {
				st := runner.Stats(c)
				now := [2]int64{st.Allowed.Load(), st.Denied.Load()}
				fmt.Fprintf(out, " %7d / %-7d |", now[0]-prev[c][0], now[1]-prev[c][1])
				prev[c] = now
			}
			bot := runner.Stats("spammer")
			pen := "none"
			if m := bot.Multiplier(); m > 0 && m < 1 {
				pen = fmt.Sprintf("x%.2f", m)
			}
			fmt.Fprintf(out, " %13d  %s\n", bot.LastLimit.Load(), pen)
		}
	}
}

// finish prints the totals and the verdict: legitimate principals penalized
// (must be none) and abusers caught.
func finish(out io.Writer, runner *traffic.Runner, actors []traffic.Actor, classes []string) summary {
	var sum summary
	for _, a := range actors {
		if a.Abusive {
			sum.Abusers++
		} else {
			sum.Legit++
		}
	}
	sum.LegitPenalized, sum.AbuseCaught = runner.Penalized(actors)
	fmt.Fprintf(out, "\ntotals:")
	for _, c := range classes {
		st := runner.Stats(c)
		fmt.Fprintf(out, " %s %d allowed / %d denied / %d errors;", c, st.Allowed.Load(), st.Denied.Load(), st.Errors.Load())
	}
	fmt.Fprintf(out, "\nlegitimate principals penalized: %d of %d %v\n", len(sum.LegitPenalized), sum.Legit, sum.LegitPenalized)
	fmt.Fprintf(out, "abusers caught: %d of %d %v\n", len(sum.AbuseCaught), sum.Abusers, sum.AbuseCaught)
	return sum
}

func printAbuse(out io.Writer, a events.Abuse) {
	fmt.Fprintf(out, "\n  ** %s detected: %s (severity %s, score %.1f)\n", a.Pattern, a.Principal.Key(), a.Severity, a.Score)
	switch a.Pattern {
	case events.PatternDistributedIP:
		fmt.Fprintf(out, "     evidence: %d distinct addresses (%d /24s, %d /64s) in %ds; %d events; first event %s\n",
			a.Evidence.DistinctIPs, a.Evidence.DistinctIP24, a.Evidence.DistinctIP64, a.Window.Seconds, a.Evidence.EventCount,
			events.FormatTime(a.FirstEventAt))
	default:
		fmt.Fprintf(out, "     evidence: %.1f checks/s vs threshold %.1f/s (window %ds); %d events; %d distinct IPs; first event %s\n",
			a.Evidence.ObservedRate, a.Evidence.Threshold, a.Window.Seconds, a.Evidence.EventCount, a.Evidence.DistinctIPs,
			events.FormatTime(a.FirstEventAt))
	}
	if b := a.Evidence.Basis; b != nil {
		fmt.Fprintf(out, "     measured against: %s (%s baselines); %.0f%% of its requests denied by the limiter", b.Source, b.BaselineKind, 100*b.DenialRatio)
		if b.Source == events.BasisNetworks {
			fmt.Fprintf(out, "; fires at %d unshared networks, %d new within seconds", b.NetworkThreshold, b.NewNetworks)
		}
		fmt.Fprintln(out)
	}
	for _, r := range a.Evidence.TopRoutes {
		fmt.Fprintf(out, "     route %-40s %d\n", r.Route, r.Count)
	}
	fmt.Fprintf(out, "     penalty: limits x%.2f, level %d, %s, until %s\n\n", a.Penalty.Multiplier, a.Penalty.Level, a.Penalty.Mode,
		events.FormatTime(a.Penalty.ExpiresAt))
}

// watchAbuse reads new abuse events from every partition of the abuse topic.
func watchAbuse(ctx context.Context, brokers []string, out chan<- events.Abuse) {
	conn, err := kafka.DialContext(ctx, "tcp", brokers[0])
	if err != nil {
		slog.Warn("watch abuse topic", "err", err)
		return
	}
	parts, err := conn.ReadPartitions(config.DefaultAbuseTopic)
	conn.Close()
	if err != nil {
		slog.Warn("watch abuse topic", "err", err)
		return
	}
	for _, p := range parts {
		go func() {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: config.DefaultAbuseTopic, Partition: p.ID, MaxWait: 250 * time.Millisecond})
			defer r.Close()
			_ = r.SetOffset(kafka.LastOffset)
			for {
				m, err := r.ReadMessage(ctx) // a partition reader without a group: nothing is committed
				if err != nil {
					return
				}
				if a, err := events.DecodeAbuse(m.Value); err == nil {
					out <- a
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
