// Command peerbench measures Floodgate's limiter and envoy ratelimit side by
// side, in one run, on the same machine, Redis and rule: Envoy's gRPC
// ShouldRateLimit for one envoy ratelimit configuration (a fixed window of
// 100 requests a second per user, 10,000 users), alternating rounds so both
// see the same machine state. Floodgate answers that domain from the same
// configuration (FLOODGATE_LIMITER_ENVOY_CONFIG).
//
//	go run ./loadtest/cmd/peerbench -duration 5s -rounds 2 -callers 64
package main

import (
	"context"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
)

func main() {
	if err := run(); err != nil {
		slog.Error("peerbench", "err", err)
		os.Exit(1)
	}
}

type result struct {
	name     string
	calls    int64
	errors   int64
	duration time.Duration
	lat      []time.Duration
}

func run() error {
	duration := flag.Duration("duration", 5*time.Second, "length of each measured round")
	rounds := flag.Int("rounds", 2, "rounds per service, alternating")
	callers := flag.Int("callers", 64, "concurrent callers")
	conns := flag.Int("conns", 4, "gRPC connections the callers share")
	users := flag.Int("users", 10000, "distinct users")
	flag.Parse()
	ctx := context.Background()
	root, err := os.Getwd()
	if err != nil {
		return err
	}
	run := fmt.Sprint(time.Now().UnixNano())
	domain := "peerbench_" + run
	cfgDir, err := os.MkdirTemp("", "peerbench-config")
	if err != nil {
		return err
	}
	defer os.RemoveAll(cfgDir)
	cfg := fmt.Sprintf("domain: %s\ndescriptors:\n  - key: user\n    rate_limit:\n      unit: second\n      requests_per_unit: 100\n", domain)
	if err := os.WriteFile(filepath.Join(cfgDir, "bench.yaml"), []byte(cfg), 0o644); err != nil {
		return err
	}
	bin, err := envoypeer.Install(ctx, filepath.Join(root, ".local", "bin"))
	if err != nil {
		return err
	}
	peer, err := envoypeer.Start(ctx, envoypeer.Options{Bin: bin, ConfigDir: cfgDir, RedisAddr: "127.0.0.1:6379", KeyPrefix: "peerbench_" + run + "_"})
	if err != nil {
		return err
	}
	defer peer.Stop()
	fgAddr, stop, err := startLimiter(root, cfgDir)
	if err != nil {
		return err
	}
	defer stop()

	targets := []struct{ name, addr string }{{"envoy ratelimit", peer.GRPCAddr}, {"floodgate", fgAddr}}
	var all []result
	for r := 0; r < *rounds; r++ {
		order := targets
		if r%2 == 1 {
			order = []struct{ name, addr string }{targets[1], targets[0]}
		}
		for _, t := range order {
			res, err := load(ctx, t.name, t.addr, domain, *duration, *callers, *conns, *users)
			if err != nil {
				return err
			}
			all = append(all, res)
			fmt.Printf("round %d %-16s %8.0f calls/s  p50 %-9s p99 %-9s errors %d\n", r+1, t.name,
				float64(res.calls)/res.duration.Seconds(), q(res.lat, 0.5), q(res.lat, 0.99), res.errors)
		}
	}
	sum := map[string]*result{}
	for _, r := range all {
		s := sum[r.name]
		if s == nil {
			s = &result{name: r.name}
			sum[r.name] = s
		}
		s.calls += r.calls
		s.errors += r.errors
		s.duration += r.duration
		s.lat = append(s.lat, r.lat...)
	}
	fmt.Printf("\n| service | calls/s | p50 | p99 | errors |\n|---|---|---|---|---|\n")
	for _, t := range targets {
		s := sum[t.name]
		slices.Sort(s.lat)
		fmt.Printf("| %s | %.0f | %s | %s | %d |\n", s.name, float64(s.calls)/s.duration.Seconds(), q(s.lat, 0.5), q(s.lat, 0.99), s.errors)
	}
	e, f := sum["envoy ratelimit"], sum["floodgate"]
	fmt.Printf("\nratio floodgate / envoy ratelimit: %.2f× (gRPC ShouldRateLimit, %d callers on %d connections, %d users, 100/s fixed window)\n",
		(float64(f.calls)/f.duration.Seconds())/(float64(e.calls)/e.duration.Seconds()), *callers, *conns, *users)
	return nil
}

func load(ctx context.Context, name, addr, domain string, d time.Duration, callers, conns, users int) (result, error) {
	clients := make([]rlsv3.RateLimitServiceClient, conns)
	for i := range clients {
		c, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return result{}, err
		}
		defer c.Close()
		clients[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	// Warm the connections.
	for _, c := range clients {
		_, _ = c.ShouldRateLimit(ctx, req(domain, 0))
	}
	var calls, errs atomic.Int64
	lats := make([][]time.Duration, callers)
	end := time.Now().Add(d)
	start := time.Now()
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			c := clients[i%conns]
			for time.Now().Before(end) {
				t0 := time.Now()
				_, err := c.ShouldRateLimit(ctx, req(domain, rng.IntN(users)))
				lats[i] = append(lats[i], time.Since(t0))
				if err != nil {
					errs.Add(1)
				}
				calls.Add(1)
			}
		}()
	}
	wg.Wait()
	var lat []time.Duration
	for _, l := range lats {
		lat = append(lat, l...)
	}
	slices.Sort(lat)
	return result{name: name, calls: calls.Load(), errors: errs.Load(), duration: time.Since(start), lat: lat}, nil
}

func req(domain string, user int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("u%05d", user)}}}}}
}

func q(lat []time.Duration, f float64) time.Duration {
	if len(lat) == 0 {
		return 0
	}
	return lat[min(len(lat)-1, int(f*float64(len(lat))))].Round(10 * time.Microsecond)
}

func startLimiter(root, envoyDir string) (string, func(), error) {
	dir, err := os.MkdirTemp("", "peerbench-limiter")
	if err != nil {
		return "", nil, err
	}
	bin := filepath.Join(dir, "limiter")
	cmd := exec.Command("go", "build", "-o", bin, "./services/limiter")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", nil, fmt.Errorf("build limiter: %w: %s", err, out)
	}
	httpAddr, grpcAddr := freeAddr(), freeAddr()
	lim := exec.Command(bin)
	lim.Env = append(os.Environ(), "FLOODGATE_LIMITER_ADDR="+httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR="+grpcAddr,
		"FLOODGATE_LIMITER_ENVOY_CONFIG="+envoyDir, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT=100", "FLOODGATE_LIMITER_INFLUX_INTERVAL=0",
		"FLOODGATE_JOURNAL_DIR="+filepath.Join(dir, "journal"), "FLOODGATE_GATEWAY=peerbench")
	lim.Stdout, lim.Stderr = os.Stderr, os.Stderr
	if err := lim.Start(); err != nil {
		return "", nil, err
	}
	stop := func() { _ = lim.Process.Signal(syscall.SIGTERM); _ = lim.Wait(); os.RemoveAll(dir) }
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", grpcAddr, 200*time.Millisecond); err == nil {
			c.Close()
			return grpcAddr, stop, nil
		}
	}
	stop()
	return "", nil, fmt.Errorf("limiter did not listen on %s", grpcAddr)
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}
