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
// After the closed-loop rounds (saturation: calls/s), each protocol runs
// -rounds open-loop rounds per service, alternating as the closed-loop
// ones, at -rate calls/s (10,000 by default, issue 15's latency target):
// every service is offered the same calls on a fixed schedule, each latency
// runs from when its call was due, so a service that falls behind is
// charged for the wait (no coordinated omission), and a round that achieved
// under 99 % of the rate, or answered its median call over 10 ms after its
// due time, says BEHIND. They are accounted as the closed-loop
// rounds are — CPU per call of the service, Redis, the broker and the
// generator, each core's busy share, INVALID when the generator's cores
// were over 90 % busy — and give the per core-second ratios at equal load,
// where the generator's cost per call, not the service's speed, sets how
// busy its cores are (issue 34). -closed=false runs only those.
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
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"sync/atomic"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/valyala/fasthttp"

	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
	"github.com/floodgate-dev/floodgate/loadtest/internal/envoyclient"
)

func main() {
	if err := run(); err != nil {
		slog.Error("peerbench", "err", err)
		os.Exit(1)
	}
}

func run() error {
	duration := flag.Duration("duration", 5*time.Second, "length of each measured round")
	rounds := flag.Int("rounds", 2, "rounds per service, alternating")
	callers := flag.Int("callers", 64, "concurrent callers")
	conns := flag.Int("conns", 4, "gRPC connections the callers share")
	users := flag.Int("users", 10000, "distinct users")
	protocols := flag.String("protocols", "grpc,http", "comma-separated: grpc, http")
	jsonOut := flag.String("json", "", "also write the results as JSON to this file (make bench reads it)")
	rate := flag.Float64("rate", 10000, "calls/s offered to every service in the open-loop rounds (-rounds per service and protocol, alternating): below the slowest service's saturation, so that all do the same work at the same rate; 0 = none")
	closed := flag.Bool("closed", true, "run the closed-loop rounds (-callers as fast as they go); false: only the open-loop rounds at -rate")
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
	quota := flag.Float64("quota", 0, "closed-loop rounds only: each service runs its rounds under a CPU quota of this many cores (its own cgroup, cpu bandwidth per 4 ms period), so that its saturation is within the generator's reach on -rest-cpus; 0 = none. A round whose service used under 85 % of the quota says SHORT (raise -callers)")
	profile := flag.String("profile", "", "write CPU and allocation profiles of Floodgate's first round per protocol (closed loop; open loop with -closed=false) into this directory (its pprof listener; costs it a few % in that round), and of the -baseline's first round too")
	flag.Parse()
	if !*closed && (*rate <= 0 || *jsonOut != "") {
		return fmt.Errorf("-closed=false needs -rate > 0 and no -json (make bench reads the closed-loop rounds)")
	}
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
	report := envoypeer.Report{Rounds: *rounds, Duration: duration.String(), Callers: *callers, Conns: *conns, Users: *users, Placement: place.String(), Quota: *quota}
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
		if base, stopBase, err = startLimiter(root, *baseline, cfgDir, *algorithm, *lease, place, stack, *profile != ""); err != nil {
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
	favoured, group, unfavour := favour(*favourFlag, members, shared)
	if unfavour != nil {
		defer unfavour()
		place.favoured, place.group = true, group
	}
	fmt.Printf("%s\n\n", favoured)
	report.Placement += "; " + favoured
	prof := profiler{dir: *profile, debugAddrs: map[string]string{"floodgate": fg.debug, baselineName: base.debug}, duration: *duration}

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
		var c envoypeer.Comparison
		if *closed {
			if c, err = compare(ctx, proto, targets, domain, regime{callers: *callers, conns: *conns, users: *users, d: *duration, quota: *quota}, *rounds, place, all, prof); err != nil {
				return err
			}
		}
		if *rate > 0 {
			// Every connection carries calls: at most max(openWorkers, -conns) in flight.
			open := regime{rate: *rate, callers: max(openWorkers, *conns), conns: *conns, users: *users, d: *duration}
			openProf := profiler{} // profiles come from the closed loop's rounds, when there are any
			if !*closed {
				openProf = prof
			}
			eq, err := compare(ctx, proto, targets, domain, open, *rounds, place, all, openProf)
			if err != nil {
				return err
			}
			c.Protocol, c.EqualLoad, c.Open = proto, &eq, openResults(eq)
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

// caller returns one call of the protocol against the target (user in, error
// out; an over-limit answer is not an error) and a function closing its
// connections.
func caller(proto string, t target, domain string, conns int) (callFunc, func(), error) {
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

func protoCaller(proto string, t target, domain string, conns int) (callFunc, func(), error) {
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
		c, err := envoyclient.Dial(t.addr)
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

func req(domain string, user int) *rlsv3.RateLimitRequest {
	return &rlsv3.RateLimitRequest{Domain: domain, Descriptors: []*rlcommon.RateLimitDescriptor{
		{Entries: []*rlcommon.RateLimitDescriptor_Entry{{Key: "user", Value: fmt.Sprintf("u%05d", user)}}}}}
}

// openWorkers bound the calls in flight in an open-loop round (at least:
// one per gRPC connection when -conns is more): enough that a service
// answering in a few ms keeps up with 10,000 calls/s.
const openWorkers = 256

// openResults are the open-loop rounds' latencies per service (from the
// rounds their sums hold), as make bench reads them.
func openResults(eq envoypeer.Comparison) []envoypeer.OpenResult {
	out := make([]envoypeer.OpenResult, len(eq.Services))
	for i, s := range eq.Services {
		out[i] = envoypeer.OpenResult{Name: s.Name, Offered: eq.Offered, Achieved: s.CallsPerSec, Calls: s.Calls, Errors: s.Errors,
			P50Ms: s.P50Ms, P99Ms: s.P99Ms, P999Ms: s.P999Ms}
	}
	return out
}
