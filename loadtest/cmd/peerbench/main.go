// Command peerbench measures Floodgate's limiter and envoy ratelimit side by
// side, in one run, on the same machine, Redis and rule (a fixed window of 100
// requests a second per user, 10,000 users), alternating rounds so both see
// the same machine state, over both protocols:
//
//   - grpc: Envoy's ShouldRateLimit for one envoy ratelimit configuration,
//     which Floodgate answers from the same file (FLOODGATE_LIMITER_ENVOY_CONFIG);
//
//   - http: envoy ratelimit's POST /json against Floodgate's POST /v1/check
//     with a principal limit of 100/s, a fixed window as the peer's
//     (-http-algorithm). The calls are not the same work:
//     Floodgate's check also takes the IP, endpoint and resource tiers and
//     publishes a decision event; envoy ratelimit's /json counts one descriptor.
//
//     go run ./loadtest/cmd/peerbench -duration 5s -rounds 2 -callers 64
//
// After the closed-loop rounds (saturation: calls/s), each protocol runs one
// open-loop round per service at -rate calls/s (10,000 by default, issue 15's
// latency target): calls are sent on a fixed schedule and each latency runs
// from when its call was due, so a service that falls behind is charged for
// the wait (no coordinated omission).
//
// Pinned (-pin), the service under test runs alone on -service-cpus and
// everything else on -rest-cpus; favoured (-favour), the run's processes
// are in one cgroup of the highest CPU weight, so the rest of a shared
// machine's work runs only in what they leave (the output's second line
// says whether they were, or why not).
package main

import (
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valyala/fasthttp"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"

	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
	"github.com/floodgate-dev/floodgate/loadtest/internal/openloop"
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
	cpu      time.Duration    // the load generator's own CPU time in the round
	procs    [3]time.Duration // CPU time of the service, Redis and the broker in the round
	lat      []time.Duration
	busy     []float64 // each core's busy share over the round (/proc/stat)
	invalid  bool      // the generator's cores were over genBusyMax busy (favoured: by the harness)
}

// busyOf is the busiest of cpus over the round.
func (r result) busyOf(cpus []int) float64 {
	m := 0.0
	for _, c := range cpus {
		if c < len(r.busy) {
			m = max(m, r.busy[c])
		}
	}
	return m
}

func run() error {
	duration := flag.Duration("duration", 5*time.Second, "length of each measured round")
	rounds := flag.Int("rounds", 2, "rounds per service, alternating")
	callers := flag.Int("callers", 64, "concurrent callers")
	conns := flag.Int("conns", 4, "gRPC connections the callers share")
	users := flag.Int("users", 10000, "distinct users")
	protocols := flag.String("protocols", "grpc,http", "comma-separated: grpc, http")
	jsonOut := flag.String("json", "", "also write the results as JSON to this file (make bench reads it)")
	rate := flag.Float64("rate", 10000, "offered calls/s of the open-loop round per service and protocol; 0 = none")
	lease := flag.Int("lease", 0, "HTTP only: Floodgate's 100/s rule leases this many units per instance (docs/limiter.md, Leases); 0 = exact, as envoy ratelimit")
	algorithm := flag.String("http-algorithm", "fixed_window", "HTTP only: the algorithm of Floodgate's 100/s principal rule (fixed_window as envoy ratelimit's, token_bucket, gcra, …)")
	pin := flag.Bool("pin", runtime.NumCPU() >= 2, "pin the service under test to -service-cpus alone and everything else (this generator, Redis, the broker, the services not under test) to -rest-cpus")
	serviceCPUs := flag.String("service-cpus", "1", "with -pin: the cores of the service under test (taskset list)")
	restCPUs := flag.String("rest-cpus", "0", "with -pin: the cores of everything else (taskset list)")
	redisFlag := flag.String("redis", "private", "private: a redis-server of this run's own on -rest-cpus (no persistence); else HOST:PORT of a running one (the shared stack's 127.0.0.1:6379, unpinned)")
	brokerFlag := flag.String("broker", "private", "private: the local stack's broker binary on a port and -rest-cpus of this run's own, in memory; else HOST:PORT of a running one")
	floor := flag.Bool("floor", true, "also measure do-nothing servers per protocol (loadtest/cmd/httpfloor -serve grpc and grpcfast / nethttp and fasthttp), pinned the same way")
	baseline := flag.String("baseline", "", "also measure this prebuilt limiter binary (e.g. go build -o /tmp/limiter-before ./services/limiter at the commit before a change) as \"floodgate baseline\", alternating with the rest: a change's before and after from one run")
	favourFlag := flag.Bool("favour", true, "put this generator, the services and a private Redis and broker into one cgroup of the highest CPU weight (cgroup v1 cpu.shares 262144 / v2 cpu.weight 10000), so other work on the machine runs only in what they leave; needs a writable cpu controller (root)")
	transport := flag.String("transport", "", "FLOODGATE_LIMITER_GRPC_TRANSPORT of the Floodgate under test only (grpc-go or floodgate; the -baseline keeps its environment's): with -baseline set to the same build, the two transports in one run")
	profile := flag.String("profile", "", "write CPU and allocation profiles of Floodgate's first round per protocol into this directory (its pprof listener; costs it a few % in that round)")
	flag.Parse()
	place, err := newPlacement(*pin, *serviceCPUs, *restCPUs)
	if err != nil {
		return err
	}
	if place.on {
		// The generator's own threads, and every one it starts later.
		if err := place.pin(os.Getpid(), place.rest); err != nil {
			return err
		}
		runtime.GOMAXPROCS(len(place.rest))
	}
	report := envoypeer.Report{Rounds: *rounds, Duration: duration.String(), Callers: *callers, Conns: *conns, Users: *users, Placement: place.String()}
	fmt.Printf("%s\n\n", place)
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
	stack := stackAddrs{redis: *redisFlag, broker: *brokerFlag}
	if *redisFlag == "private" || *brokerFlag == "private" {
		pv, err := startPrivate(ctx, place, root, *redisFlag == "private", *brokerFlag == "private", limiterTopics)
		if err != nil {
			return err
		}
		defer pv.stop()
		if *redisFlag == "private" {
			stack.redis, stack.redisPid = pv.redisAddr, pv.redisPid
		}
		if *brokerFlag == "private" {
			stack.broker, stack.brokerPid = pv.brokerAddr, pv.brokerPid
		}
	}
	if stack.redisPid == 0 {
		if stack.redisPid, err = redisPid(ctx, stack.redis); err != nil {
			return err
		}
	}
	if stack.brokerPid == 0 {
		stack.brokerPid = brokerPid()
	}
	var wrap []string
	if place.on {
		wrap = []string{"taskset", "-c", cpuList(place.service)}
	}
	peer, err := envoypeer.Start(ctx, envoypeer.Options{Bin: bin, ConfigDir: cfgDir, RedisAddr: stack.redis, KeyPrefix: "peerbench_" + run + "_", Wrap: wrap})
	if err != nil {
		return err
	}
	defer peer.Stop()
	var fgEnv []string
	if *transport != "" {
		fgEnv = append(fgEnv, "FLOODGATE_LIMITER_GRPC_TRANSPORT="+*transport)
	}
	fg, stop, err := startLimiter(root, "", cfgDir, *algorithm, *lease, place, stack, *profile != "", fgEnv...)
	if err != nil {
		return err
	}
	defer stop()
	var base limiterAddrs
	if *baseline != "" {
		var stopBase func()
		if base, stopBase, err = startLimiter(root, *baseline, cfgDir, *algorithm, *lease, place, stack, false); err != nil {
			return err
		}
		defer stopBase()
	}
	// envoy ratelimit publishes nothing: the broker's CPU in its rounds is
	// not its own, so its column stays 0.
	peerPids, fgPids := pids{service: peer.Pid(), redis: stack.redisPid}, pids{service: fg.pid, redis: stack.redisPid, broker: stack.brokerPid}
	var floors floorAddrs
	if *floor {
		var stopFloors func()
		if floors, stopFloors, err = startFloors(root, place); err != nil {
			return err
		}
		defer stopFloors()
	}
	// Every service starts on the service cores (GOMAXPROCS sized to them)
	// and waits on the rest's until its round.
	all := []int{peer.Pid(), fg.pid, floors.grpcPid, floors.grpcFastPid, floors.httpPid, floors.httpFastPid, base.pid}
	basePids := pids{service: base.pid, redis: stack.redisPid, broker: stack.brokerPid}
	for _, pid := range all {
		if err := place.pin(pid, place.rest); err != nil {
			return err
		}
	}
	members := []member{{"generator", os.Getpid()}, {"envoy ratelimit", peer.Pid()}, {"floodgate", fg.pid},
		{"floodgate baseline", base.pid}, {"grpc floor", floors.grpcPid}, {"grpcfast floor", floors.grpcFastPid}, {"http floor", floors.httpPid},
		{"fasthttp floor", floors.httpFastPid}}
	var shared []string
	if *redisFlag == "private" {
		members = append(members, member{"redis", stack.redisPid})
	} else {
		shared = append(shared, "redis "+stack.redis)
	}
	if *brokerFlag == "private" {
		members = append(members, member{"broker", stack.brokerPid})
	} else {
		shared = append(shared, "broker "+stack.broker)
	}
	favoured, unfavour := favour(*favourFlag, members, shared)
	if unfavour != nil {
		defer unfavour()
		place.favoured = true
	}
	fmt.Printf("%s\n\n", favoured)
	report.Placement += "; " + favoured
	prof := profiler{dir: *profile, debugAddr: fg.debug, duration: *duration}

	for _, proto := range strings.Split(*protocols, ",") {
		var targets []target
		switch proto {
		case "grpc":
			targets = []target{{"envoy ratelimit", peer.GRPCAddr, peerPids}, {"floodgate", fg.grpc, fgPids}}
			if *floor {
				targets = append(targets, target{floorName, floors.grpc, pids{service: floors.grpcPid, redis: stack.redisPid}},
					target{fastFloorName, floors.grpcFast, pids{service: floors.grpcFastPid, redis: stack.redisPid}})
			}
			if *baseline != "" {
				targets = append(targets, target{baselineName, base.grpc, basePids})
			}
		case "http":
			targets = []target{{"envoy ratelimit", "http://" + peer.HTTPAddr + "/json", peerPids}, {"floodgate", "http://" + fg.http + "/v1/check", fgPids}}
			if *floor {
				targets = append(targets, target{floorName, "http://" + floors.http + "/v1/check", pids{service: floors.httpPid, redis: stack.redisPid}},
					target{fastHTTPFloorName, "http://" + floors.httpFast + "/v1/check", pids{service: floors.httpFastPid, redis: stack.redisPid}})
			}
			if *baseline != "" {
				targets = append(targets, target{baselineName, "http://" + base.http + "/v1/check", basePids})
			}
		default:
			return fmt.Errorf("-protocols: %q is not grpc or http", proto)
		}
		c, err := compare(ctx, proto, targets, domain, *duration, *rounds, *callers, *conns, *users, place, all, prof)
		if err != nil {
			return err
		}
		if *rate > 0 {
			if c.Open, err = openRounds(ctx, proto, targets[:2], domain, *duration, *rate, *conns, *users, place, all); err != nil {
				return err
			}
		}
		report.Comparisons = append(report.Comparisons, c)
	}
	ev, err := deliveries(ctx, fg.http, floodgateAnswered.Load())
	if err != nil {
		return err
	}
	report.Events = &ev
	verdict := "every one delivered"
	if !ev.Delivered() {
		verdict = "NOT every one delivered"
	}
	fmt.Printf("floodgate decision events: %d calls answered over every round (warm-ups included); %.0f sent to Kafka, %.0f refused, %.0f failed, %.0f dropped by the journal: %s\n",
		ev.Calls, ev.Sent, ev.Dropped, ev.Failed, ev.JournalDropped, verdict)
	if *jsonOut != "" {
		b, err := json.MarshalIndent(report, "", "  ")
		if err != nil {
			return err
		}
		if err := os.WriteFile(*jsonOut, append(b, '\n'), 0o644); err != nil {
			return fmt.Errorf("-json: %w", err)
		}
	}
	return nil
}

type target struct {
	name, addr string
	pids       pids // the processes on its calls' path
}

// floorName is the do-nothing server's name in the tables (gRPC on
// grpc-go, HTTP on net/http), fastFloorName the same gRPC service's on
// pkg/grpcfast, fastHTTPFloorName the same HTTP server's on fasthttp (the
// limiter's own HTTP server); baselineName the -baseline limiter's.
const (
	floorName         = "floor (does nothing)"
	fastFloorName     = "floor on grpcfast"
	fastHTTPFloorName = "floor on fasthttp"
	baselineName      = "floodgate baseline"
)

// genBusyMax is the busiest the generator's cores may be in a valid round:
// beyond it the generator, not the service, may set the pace. Favoured,
// the share is the run's own processes' there (the generator, Redis and
// the broker: the harness), as the chaos overload scenario counts it — the
// machine's other work fills those cores too, but only in what the
// harness leaves.
const genBusyMax = 0.90

// harnessShare is the share of the rest's cores the generator, Redis and
// the broker used in the round.
func (r result) harnessShare(rest []int) float64 {
	return (r.cpu + r.procs[1] + r.procs[2]).Seconds() / r.duration.Seconds() / float64(max(len(rest), 1))
}

// compare runs alternating rounds against the targets over one protocol
// (each round's service alone on the service cores, every other process on
// the rest's) and prints the per-round figures, the summary table and the
// ratios. A round whose generator cores were over 90 % busy (favoured: 90 %
// used by the generator, Redis and the broker) is INVALID and left out of
// the sums, unless every round of the service was.
func compare(ctx context.Context, proto string, targets []target, domain string, d time.Duration, rounds, callers, conns, users int, place placement, all []int, prof profiler) (envoypeer.Comparison, error) {
	var results []result
	for r := 0; r < rounds; r++ {
		order := slices.Clone(targets)
		if r%2 == 1 {
			slices.Reverse(order)
		}
		for _, t := range order {
			if err := place.onlyUnderTest(t.pids.service, all); err != nil {
				return envoypeer.Comparison{}, err
			}
			call, closeAll, err := caller(proto, t, domain, conns)
			if err != nil {
				return envoypeer.Comparison{}, err
			}
			var stopProf func() error
			if r == 0 && t.name == "floodgate" {
				stopProf = prof.start(proto)
			}
			res := load(ctx, t, call, d, callers, users)
			closeAll()
			if stopProf != nil {
				if err := stopProf(); err != nil {
					return envoypeer.Comparison{}, err
				}
			}
			res.invalid = place.on && res.busyOf(place.rest) > genBusyMax
			if place.favoured {
				res.invalid = place.on && res.harnessShare(place.rest) > genBusyMax
			}
			results = append(results, res)
			mark := ""
			switch {
			case res.invalid && place.favoured:
				mark = fmt.Sprintf("  INVALID: generator, Redis and broker used %.0f %% of cpu %s (the generator itself %.0f %%)", 100*res.harnessShare(place.rest), cpuList(place.rest),
					100*res.cpu.Seconds()/res.duration.Seconds()/float64(len(place.rest)))
			case place.favoured:
				mark = fmt.Sprintf("  harness %.0f %% of cpu %s", 100*res.harnessShare(place.rest), cpuList(place.rest))
			case res.invalid:
				// The generator's own share says whether it or the
				// machine's other tenants filled its cores.
				mark = fmt.Sprintf("  INVALID: generator cpu %s %.0f %% busy (the generator itself %.0f %% of it)", cpuList(place.rest), 100*res.busyOf(place.rest),
					100*res.cpu.Seconds()/res.duration.Seconds()/float64(len(place.rest)))
			}
			if place.on {
				// A saturated service short of its core shares it with
				// processes outside the run.
				mark = fmt.Sprintf("  service ran %.0f %% of cpu %s", 100*res.procs[0].Seconds()/res.duration.Seconds()/float64(len(place.service)), cpuList(place.service)) + mark
			}
			fmt.Printf("%s round %d %-20s %8.0f calls/s  %5.1f µs service CPU/call  p50 %-9s p99 %-9s errors %d  cores busy %s%s\n", proto, r+1, t.name,
				float64(res.calls)/res.duration.Seconds(), float64(res.procs[0].Microseconds())/float64(max(res.calls, 1)), q(res.lat, 0.5), q(res.lat, 0.99), res.errors, busyString(res.busy), mark)
		}
	}
	sum := map[string]*result{}
	count := map[string][2]int{} // rounds, invalid
	for _, r := range results {
		n := count[r.name]
		n[0]++
		if r.invalid {
			n[1]++
		}
		count[r.name] = n
	}
	for _, r := range results {
		if r.invalid && count[r.name][1] < count[r.name][0] {
			continue // a valid round of the service exists: this one is left out
		}
		s := sum[r.name]
		if s == nil {
			s = &result{name: r.name}
			sum[r.name] = s
		}
		s.calls += r.calls
		s.errors += r.errors
		s.duration += r.duration
		s.cpu += r.cpu
		for i := range s.procs {
			s.procs[i] += r.procs[i]
		}
		s.lat = append(s.lat, r.lat...)
		if s.busy == nil {
			s.busy = make([]float64, len(r.busy))
		}
		for i := range min(len(s.busy), len(r.busy)) {
			s.busy[i] += r.busy[i] * r.duration.Seconds()
		}
	}
	c := envoypeer.Comparison{Protocol: proto}
	fmt.Printf("\n%s\n| service | calls/s | p50 | p99 | errors | load generator CPU | CPU µs per call: service + Redis + broker + generator | calls per service core-second | cores busy | rounds (invalid) |\n|---|---|---|---|---|---|---|---|---|---|\n", proto)
	for _, t := range targets {
		s := sum[t.name]
		slices.Sort(s.lat)
		for i := range s.busy {
			s.busy[i] /= s.duration.Seconds()
		}
		n := count[t.name]
		sr := envoypeer.ServiceResult{Name: s.name, Calls: s.calls, Errors: s.errors, CallsPerSec: float64(s.calls) / s.duration.Seconds(),
			P50Ms: msOf(q(s.lat, 0.5)), P99Ms: msOf(q(s.lat, 0.99)),
			LoadgenCPU: s.cpu.Seconds() / (s.duration.Seconds() * float64(runtime.NumCPU())),
			Rounds:     n[0], Invalid: n[1], AllInvalid: n[1] == n[0], CoreBusy: s.busy}
		perCall := func(d time.Duration) float64 { return float64(d.Microseconds()) / float64(max(s.calls, 1)) }
		sr.CPU = envoypeer.CallCPU{Service: perCall(s.procs[0]), Redis: perCall(s.procs[1]), Broker: perCall(s.procs[2]), Generator: perCall(s.cpu)}
		c.Services = append(c.Services, sr)
		inv := fmt.Sprintf("%d (%d)", n[0], n[1])
		if sr.AllInvalid {
			inv += " ALL INVALID"
		}
		fmt.Printf("| %s | %.0f | %s | %s | %d | %.0f %% | %.1f + %.1f + %.1f + %.1f = %.1f | %.0f | %s | %s |\n", s.name, sr.CallsPerSec, q(s.lat, 0.5), q(s.lat, 0.99), s.errors, 100*sr.LoadgenCPU,
			sr.CPU.Service, sr.CPU.Redis, sr.CPU.Broker, sr.CPU.Generator, sr.CPU.Total(), sr.PerCoreSecond(), busyString(sr.CoreBusy), inv)
	}
	e, f := sum["envoy ratelimit"], sum["floodgate"]
	c.Ratio = (float64(f.calls) / f.duration.Seconds()) / (float64(e.calls) / e.duration.Seconds())
	es, fs := c.Services[0].CPU, c.Services[1].CPU
	c.ServiceCPURatio = es.Service / max(fs.Service, 1e-9)
	fmt.Printf("\nratio floodgate / envoy ratelimit over %s: %.2f× in calls/s (%d callers on %d connections, %d users, 100/s fixed window)\n",
		proto, c.Ratio, callers, conns, users)
	fmt.Printf("service CPU per call, envoy ratelimit / floodgate: %.1f / %.1f µs = %.2f× per core-second (machine CPU per call: %.0f / %.0f µs)\n",
		es.Service, fs.Service, c.ServiceCPURatio, es.Total(), fs.Total())
	for _, sr := range c.Services[2:] {
		switch sr.Name {
		case floorName:
			c.FloorCPURatio = sr.CPU.Service / max(fs.Service, 1e-9)
			fmt.Printf("service CPU per call, floor / floodgate: %.1f / %.1f µs: floodgate costs %.2f× the floor (per core-second %.2f× of it)\n",
				sr.CPU.Service, fs.Service, fs.Service/max(sr.CPU.Service, 1e-9), c.FloorCPURatio)
		case fastFloorName:
			fmt.Printf("service CPU per call, floor on grpcfast / floodgate: %.1f / %.1f µs (envoy ratelimit / grpcfast floor %.2f×)\n",
				sr.CPU.Service, fs.Service, es.Service/max(sr.CPU.Service, 1e-9))
		case fastHTTPFloorName:
			fmt.Printf("service CPU per call, floor on fasthttp / floodgate: %.1f / %.1f µs: floodgate costs %.2f× the fasthttp floor\n",
				sr.CPU.Service, fs.Service, fs.Service/max(sr.CPU.Service, 1e-9))
		case baselineName:
			fmt.Printf("service CPU per call, baseline / floodgate: %.1f / %.1f µs = %.2f× (envoy ratelimit / baseline %.2f×)\n",
				sr.CPU.Service, fs.Service, sr.CPU.Service/max(fs.Service, 1e-9), es.Service/max(sr.CPU.Service, 1e-9))
		}
	}
	fmt.Println()
	return c, nil
}

// busyString prints each core's busy share: "cpu0 95 % cpu1 78 %".
func busyString(b []float64) string {
	parts := make([]string, len(b))
	for i, v := range b {
		parts[i] = fmt.Sprintf("cpu%d %.0f %%", i, 100*v)
	}
	return strings.Join(parts, " ")
}

func msOf(d time.Duration) float64 { return float64(d.Microseconds()) / 1000 }

// caller returns one call of the protocol against the target (user in, error
// out; an over-limit answer is not an error) and a function closing its
// connections.
func caller(proto string, t target, domain string, conns int) (func(ctx context.Context, worker, user int) error, func(), error) {
	call, closeAll, err := protoCaller(proto, t, domain, conns)
	if err != nil || t.name != "floodgate" {
		return call, closeAll, err
	}
	return func(ctx context.Context, worker, user int) error {
		err := call(ctx, worker, user)
		if err == nil {
			floodgateAnswered.Add(1)
		}
		return err
	}, closeAll, nil
}

// floodgateAnswered counts Floodgate's answered calls over the whole run:
// each must leave a decision event (deliveries).
var floodgateAnswered atomic.Int64

func protoCaller(proto string, t target, domain string, conns int) (func(ctx context.Context, worker, user int) error, func(), error) {
	if proto == "http" {
		// fasthttp's client costs less CPU per call than net/http's, so the
		// generator takes less of the two cores it shares with the services
		// it measures (its share is in the report; docs/benchmarks.md).
		u, err := url.Parse(t.addr)
		if err != nil {
			return nil, nil, err
		}
		hc := &fasthttp.HostClient{Addr: u.Host, MaxConns: 1024, ReadTimeout: 5 * time.Second, WriteTimeout: 5 * time.Second}
		floodgate := t.name != "envoy ratelimit" // Floodgate, its baseline and the floor take a check
		return func(_ context.Context, _, user int) error {
			req, resp := fasthttp.AcquireRequest(), fasthttp.AcquireResponse()
			defer fasthttp.ReleaseRequest(req)
			defer fasthttp.ReleaseResponse(resp)
			req.SetRequestURI(t.addr)
			req.Header.SetMethod(fasthttp.MethodPost)
			req.Header.SetContentType("application/json")
			if floodgate {
				req.SetBodyString(fmt.Sprintf(`{"principal":{"kind":"user","id":"u%05d"},"ip":"203.0.113.%d","method":"GET","route":"/v1/items"}`, user, user%250+1))
			} else {
				req.SetBodyString(fmt.Sprintf(`{"domain":%q,"descriptors":[{"entries":[{"key":"user","value":"u%05d"}]}]}`, domain, user))
			}
			if err := hc.Do(req, resp); err != nil {
				return err
			}
			if code := resp.StatusCode(); code != http.StatusOK && code != http.StatusTooManyRequests {
				return fmt.Errorf("%s: status %d", t.addr, code)
			}
			return nil
		}, hc.CloseIdleConnections, nil
	}
	clients := make([]rlsv3.RateLimitServiceClient, conns)
	var closers []func() error
	for i := range clients {
		c, err := grpc.NewClient(t.addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
		if err != nil {
			return nil, nil, err
		}
		closers = append(closers, c.Close)
		clients[i] = rlsv3.NewRateLimitServiceClient(c)
	}
	return func(ctx context.Context, worker, user int) error {
			_, err := clients[worker%conns].ShouldRateLimit(ctx, req(domain, user))
			return err
		}, func() {
			for _, c := range closers {
				_ = c()
			}
		}, nil
}

func load(ctx context.Context, t target, call func(ctx context.Context, worker, user int) error, d time.Duration, callers, users int) result {
	warm(ctx, call, callers)
	var calls, errs atomic.Int64
	lats := make([][]time.Duration, callers)
	end := time.Now().Add(d)
	start, cpu0, procs0 := time.Now(), cputime.Self(), t.pids.cpu()
	busy0, total0 := cputime.CoreTimes()
	var wg sync.WaitGroup
	for i := 0; i < callers; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			rng := rand.New(rand.NewPCG(uint64(i), 7))
			for time.Now().Before(end) {
				t0 := time.Now()
				err := call(ctx, i, rng.IntN(users))
				lats[i] = append(lats[i], time.Since(t0))
				if err != nil {
					errs.Add(1)
				}
				calls.Add(1)
			}
		}()
	}
	wg.Wait()
	elapsed, cpu, procs := time.Since(start), cputime.Self()-cpu0, t.pids.cpu()
	busy1, total1 := cputime.CoreTimes()
	for i := range procs {
		procs[i] -= procs0[i]
	}
	var lat []time.Duration
	for _, l := range lats {
		lat = append(lat, l...)
	}
	slices.Sort(lat)
	return result{name: t.name, calls: calls.Load(), errors: errs.Load(), duration: elapsed, cpu: cpu, procs: procs, lat: lat,
		busy: cputime.CoreBusy(busy0, total0, busy1, total1)}
}

// warm makes one call from each of n callers at once, so that every
// connection the round will use is dialed before its clock starts (calls
// one after another would all ride one HTTP connection).
func warm(ctx context.Context, call func(ctx context.Context, worker, user int) error, n int) {
	var wg sync.WaitGroup
	for i := range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			_ = call(ctx, i, 0)
		}()
	}
	wg.Wait()
}

// openWorkers bound the calls in flight in an open-loop round: enough that
// a service answering in a few ms keeps up with 10,000 calls/s.
const openWorkers = 256

// openRounds runs one open-loop round per service at rate calls/s (the
// second service first, as the closed-loop rounds alternate) and prints them.
func openRounds(ctx context.Context, proto string, targets []target, domain string, d time.Duration, rate float64, conns, users int, place placement, all []int) ([]envoypeer.OpenResult, error) {
	out := make([]envoypeer.OpenResult, len(targets))
	fmt.Printf("%s open loop at %.0f calls/s offered, %s per service, at most %d in flight\n\n| service | offered | achieved | p50 | p99 | p99.9 | errors |\n|---|---|---|---|---|---|---|\n",
		proto, rate, d, openWorkers)
	for i := len(targets) - 1; i >= 0; i-- {
		t := targets[i]
		if err := place.onlyUnderTest(t.pids.service, all); err != nil {
			return nil, err
		}
		call, closeAll, err := caller(proto, t, domain, conns)
		if err != nil {
			return nil, err
		}
		out[i] = openLoad(ctx, t, call, d, rate, users)
		closeAll()
	}
	for _, o := range out {
		fmt.Printf("| %s | %.0f/s | %.0f/s | %.2f ms | %.2f ms | %.2f ms | %d |\n", o.Name, o.Offered, o.Achieved, o.P50Ms, o.P99Ms, o.P999Ms, o.Errors)
	}
	fmt.Println()
	return out, nil
}

// openLoad offers rate calls/s to t for d from openWorkers callers
// (openloop: each latency from its call's due time).
func openLoad(ctx context.Context, t target, call func(ctx context.Context, worker, user int) error, d time.Duration, rate float64, users int) envoypeer.OpenResult {
	warm(ctx, call, openWorkers)
	rngs := make([]*rand.Rand, openWorkers)
	for w := range rngs {
		rngs[w] = rand.New(rand.NewPCG(uint64(w), 11))
	}
	start := time.Now()
	lat, errs := openloop.Run(rate, d, openWorkers, func(w int) error { return call(ctx, w, rngs[w].IntN(users)) })
	elapsed := time.Since(start)
	return envoypeer.OpenResult{Name: t.name, Offered: rate, Achieved: float64(len(lat)) / elapsed.Seconds(), Calls: int64(len(lat)), Errors: errs,
		P50Ms: msOf(q(lat, 0.5)), P99Ms: msOf(q(lat, 0.99)), P999Ms: msOf(q(lat, 0.999))}
}

func req(domain string, user int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("u%05d", user)}}}}}
}

func q(lat []time.Duration, f float64) time.Duration {
	return openloop.Quantile(lat, f).Round(10 * time.Microsecond)
}
