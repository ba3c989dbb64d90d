// Command demo runs the Floodgate pipeline on the local stack and narrates it:
// it starts the limiter and the detector, sends normal users and one rapid-fire
// bot through the limiter, and prints decisions per second and the penalty the
// detector applied, with its evidence. Ctrl-C stops everything it started.
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
	if err := run(ctx, os.Args[1:]); err != nil {
		slog.Error("demo", "err", err)
		os.Exit(1)
	}
}

func run(ctx context.Context, args []string) error {
	fs := flag.NewFlagSet("demo", flag.ContinueOnError)
	duration := fs.Duration("duration", 60*time.Second, "how long to send traffic (Ctrl-C stops earlier)")
	users := fs.Int("users", 40, "normal users, about one check a second each")
	botRate := fs.Float64("bot-rate", 300, "checks per second of the rapid-fire bot")
	binDir := fs.String("bin", ".local/bin", "where `make build` put the services")
	logDir := fs.String("logs", ".local/log", "where service logs go")
	if err := fs.Parse(args); err != nil {
		return err
	}
	runID := time.Now().UTC().Format("150405")
	brokers := config.NewEnv(os.Getenv).List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers)

	pager, pagerURL, pages := pagerReceiver()
	defer pager.Close()
	limiterAddr, detectorAddr := "127.0.0.1:8080", "127.0.0.1:8082"
	procs := []*exec.Cmd{}
	defer func() { stopAll(procs) }()
	for _, svc := range []struct {
		name string
		env  []string
	}{
		// One 50/s bucket per principal keeps the story readable: 50 → 5 under the penalty.
		{"limiter", []string{"FLOODGATE_LIMITER_ADDR=" + limiterAddr, "FLOODGATE_GATEWAY=demo", "FLOODGATE_LIMITER_PRINCIPAL_LIMIT=50",
			"FLOODGATE_JOURNAL_DIR=.local/data/journal/demo-limiter"}},
		{"detector", []string{
			// Fresh groups that start at the end of the topics: the demo shows live
			// traffic only, whatever history earlier runs or benchmarks left there.
			"FLOODGATE_DETECTOR_ADDR=" + detectorAddr, "FLOODGATE_DETECTOR_GROUP=demo-detector-" + runID,
			"FLOODGATE_PAGER_GROUP=demo-pager-" + runID, "FLOODGATE_DETECTOR_START_OFFSET=last", "FLOODGATE_DETECTOR_WINDOW=10s",
			"FLOODGATE_DETECTOR_RAPID_FIRE_RATE=20", "FLOODGATE_DETECTOR_PENALTY_TTL=2m",
			"FLOODGATE_PAGERDUTY_ROUTING_KEY=demo", "FLOODGATE_PAGERDUTY_URL=" + pagerURL,
		}},
	} {
		cmd, err := startService(filepath.Join(*binDir, svc.name), filepath.Join(*logDir, "demo-"+svc.name+".log"), svc.env)
		if err != nil {
			return err
		}
		procs = append(procs, cmd)
	}
	for _, url := range []string{"http://" + limiterAddr + "/readyz", "http://" + detectorAddr + "/readyz"} {
		if err := waitReady(ctx, url); err != nil {
			return fmt.Errorf("%w (logs in %s)", err, *logDir)
		}
	}
	fmt.Printf("limiter on %s, detector on %s; logs in %s\n", limiterAddr, detectorAddr, *logDir)
	fmt.Printf("traffic: %d normal users at ~1 check/s, 1 bot at %.0f checks/s, for %s (Ctrl-C to stop)\n\n", *users, *botRate, *duration)

	abuse := make(chan events.Abuse, 16)
	watchCtx, stopWatch := context.WithCancel(ctx)
	defer stopWatch()
	go watchAbuse(watchCtx, brokers, abuse)

	trafficCtx, stopTraffic := context.WithTimeout(ctx, *duration)
	defer stopTraffic()
	runner := traffic.NewRunner("http://" + limiterAddr)
	done := make(chan struct{})
	go func() { runner.Run(trafficCtx, traffic.DemoActors(*users, *botRate, runID)); close(done) }()

	normal, bot := runner.Stats("normal"), runner.Stats("bot")
	var prevN, prevB [2]int64
	tick := time.NewTicker(time.Second)
	defer tick.Stop()
	start := time.Now()
	fmt.Printf("%5s | %-25s | %-40s\n", "t", "normal users ok/blocked /s", "bot ok/blocked /s   limit   penalty")
	for {
		select {
		case <-done:
			fmt.Printf("\ntotals: normal users %d allowed, %d blocked, %d errors; bot %d allowed, %d blocked, %d errors\n",
				normal.Allowed.Load(), normal.Denied.Load(), normal.Errors.Load(), bot.Allowed.Load(), bot.Denied.Load(), bot.Errors.Load())
			return nil
		case a := <-abuse:
			printAbuse(a)
		case p := <-pages:
			fmt.Printf("      >> PagerDuty page: %s\n", p)
		case <-tick.C:
			n := [2]int64{normal.Allowed.Load(), normal.Denied.Load()}
			b := [2]int64{bot.Allowed.Load(), bot.Denied.Load()}
			pen := "none"
			if m := bot.Multiplier(); m > 0 && m < 1 {
				pen = fmt.Sprintf("x%.2f", m)
			}
			fmt.Printf("%4.0fs | %8d / %-14d | %8d / %-8d %7d   %s\n", time.Since(start).Seconds(),
				n[0]-prevN[0], n[1]-prevN[1], b[0]-prevB[0], b[1]-prevB[1], bot.LastLimit.Load(), pen)
			prevN, prevB = n, b
		}
	}
}

func printAbuse(a events.Abuse) {
	fmt.Printf("\n  ** %s detected: %s (severity %s, score %.1f)\n", a.Pattern, a.Principal.Key(), a.Severity, a.Score)
	fmt.Printf("     evidence: %.1f checks/s vs threshold %.1f/s (window %ds); %d events; %d distinct IPs; first event %s\n",
		a.Evidence.ObservedRate, a.Evidence.Threshold, a.Window.Seconds, a.Evidence.EventCount, a.Evidence.DistinctIPs,
		events.FormatTime(a.FirstEventAt))
	for _, r := range a.Evidence.TopRoutes {
		fmt.Printf("     route %-40s %d\n", r.Route, r.Count)
	}
	fmt.Printf("     penalty: limits x%.2f, level %d, %s, until %s\n\n", a.Penalty.Multiplier, a.Penalty.Level, a.Penalty.Mode,
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

func stopAll(procs []*exec.Cmd) {
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
	fmt.Println("stopped the limiter and the detector")
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
