// Command httpfloor measures what one HTTP/1.1 exchange of a check's shape
// costs a Go server on this machine, apart from any limiter: the server reads
// a 100-byte JSON body into a struct and answers a fixed 400-byte JSON
// decision, once on net/http (what the limiter serves) and once on fasthttp.
// Each server runs in a process of its own (this binary with -serve); the
// load comes from this process over keep-alive connections, and the report
// is the server process's CPU time per request (/proc), alternating rounds.
//
//	go run ./loadtest/cmd/httpfloor -rounds 2 -duration 8s -conns 64
//
// With -serve grpc it is the gRPC floor instead: envoy's ShouldRateLimit
// answered OK, one OK status per descriptor, by a plain grpc-go server —
// what peerbench measures beside envoy ratelimit and Floodgate; with -serve
// grpcfast the same service on pkg/grpcfast, Floodgate's own transport.
//
// It bounds what a leaner HTTP stack could take off the limiter's CPU per
// check (docs/benchmarks.md, "Beside envoy ratelimit"). With -rate it then
// offers each server that many requests a second open loop (256 callers,
// each latency from its request's due time, as peerbench's open-loop round):
// the latency floor of this machine and generator for a server that does
// next to nothing.
package main

import (
	"bufio"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"os"
	"os/exec"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
	"github.com/floodgate-dev/floodgate/loadtest/internal/openloop"
)

// checkBody is the request's shape (POST /v1/check).
type checkBody struct {
	Principal struct {
		Kind string `json:"kind"`
		ID   string `json:"id"`
	} `json:"principal"`
	IP     string `json:"ip"`
	Method string `json:"method"`
	Route  string `json:"route"`
}

var (
	body   = []byte(`{"principal":{"kind":"user","id":"u-123"},"ip":"198.51.100.23","method":"GET","route":"/v1/things"}`)
	answer = []byte(`{"id":"0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6a7b","allowed":true,"tier":"principal","rule":"people",` +
		`"limit":1000000,"remaining":999999,"reset_after_ms":1000,"retry_after_ms":0,"penalty_multiplier":1,"scale":1,` +
		`"priority":"degraded","headers":{"RateLimit-Limit":"1000000","RateLimit-Remaining":"999999","RateLimit-Reset":"1",` +
		`"X-Request-Id":"0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6a7b"}}`)
)

func main() {
	if err := run(); err != nil {
		slog.Error("httpfloor", "err", err)
		os.Exit(1)
	}
}

func run() error {
	serve := flag.String("serve", "", "serve with nethttp, fasthttp, grpc or grpcfast (a do-nothing envoy rate-limit service on grpc-go or on pkg/grpcfast) on a loopback port, print the address and run until killed (peerbench's floors)")
	rounds := flag.Int("rounds", 2, "rounds per server, alternating")
	duration := flag.Duration("duration", 8*time.Second, "length of a round")
	conns := flag.Int("conns", 64, "keep-alive connections, one caller each")
	rate := flag.Float64("rate", 0, "then an open-loop round per server at this many requests/s; 0 = none")
	flag.Parse()
	if *serve != "" {
		return serveWith(*serve)
	}
	self, err := os.Executable()
	if err != nil {
		return err
	}
	fmt.Printf("| round | server | requests/s | server CPU µs per request |\n|---|---|---|---|\n")
	for r := 1; r <= *rounds; r++ {
		order := []string{"nethttp", "fasthttp"}
		if r%2 == 0 {
			order = []string{"fasthttp", "nethttp"}
		}
		for _, s := range order {
			n, cpu, elapsed, err := round(self, s, *duration, *conns)
			if err != nil {
				return err
			}
			fmt.Printf("| %d | %s | %.0f | %.1f |\n", r, s, float64(n)/elapsed.Seconds(), float64(cpu.Microseconds())/float64(max(n, 1)))
		}
	}
	if *rate > 0 {
		fmt.Printf("\nopen loop at %.0f requests/s, %s per server, at most %d in flight\n\n| server | p50 | p99 | p99.9 | errors |\n|---|---|---|---|---|\n", *rate, *duration, openWorkers)
		for _, s := range []string{"nethttp", "fasthttp"} {
			lat, errs, err := openRound(self, s, *duration, *rate)
			if err != nil {
				return err
			}
			fmt.Printf("| %s | %s | %s | %s | %d |\n", s, quantile(lat, 0.5), quantile(lat, 0.99), quantile(lat, 0.999), errs)
		}
	}
	return nil
}

// openWorkers bound the requests in flight in an open-loop round.
const openWorkers = 256

// start runs a server process and returns its address and a stop function.
func start(self, server string) (string, *exec.Cmd, func(), error) {
	cmd := exec.Command(self, "-serve", server)
	out, err := cmd.StdoutPipe()
	if err != nil {
		return "", nil, nil, err
	}
	cmd.Stderr = os.Stderr
	if err := cmd.Start(); err != nil {
		return "", nil, nil, err
	}
	stop := func() { _ = cmd.Process.Kill(); _ = cmd.Wait() }
	addr, err := bufio.NewReader(out).ReadString('\n')
	if err != nil {
		stop()
		return "", nil, nil, fmt.Errorf("%s: no address: %w", server, err)
	}
	return strings.TrimSpace(addr), cmd, stop, nil
}

// openRound offers rate requests/s to a server for d from openWorkers
// callers (openloop: each latency from its request's due time), every
// connection dialed first.
func openRound(self, server string, d time.Duration, rate float64) ([]time.Duration, int64, error) {
	addr, _, stop, err := start(self, server)
	if err != nil {
		return nil, 0, err
	}
	defer stop()
	client := &fasthttp.HostClient{Addr: addr, MaxConns: openWorkers}
	reqs, resps := make([]*fasthttp.Request, openWorkers), make([]*fasthttp.Response, openWorkers)
	for w := range reqs {
		reqs[w], resps[w] = checkRequest(addr), fasthttp.AcquireResponse()
	}
	call := func(w int) error {
		if err := client.Do(reqs[w], resps[w]); err != nil {
			return err
		}
		if code := resps[w].StatusCode(); code != http.StatusOK {
			return fmt.Errorf("status %d", code)
		}
		return nil
	}
	var warm sync.WaitGroup
	for w := range openWorkers { // dial every connection before the clock starts
		warm.Add(1)
		go func() { defer warm.Done(); _ = call(w) }()
	}
	warm.Wait()
	lat, errs := openloop.Run(rate, d, openWorkers, call)
	return lat, errs, nil
}

// checkRequest is a POST /v1/check of body to addr.
func checkRequest(addr string) *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI("http://" + addr + "/v1/check")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	req.SetBodyRaw(body)
	return req
}

func quantile(lat []time.Duration, q float64) string {
	return openloop.Quantile(lat, q).Round(10 * time.Microsecond).String()
}

// round starts a server process and loads it for d; it returns the answers,
// the server's CPU time over the load and the load's wall time.
func round(self, server string, d time.Duration, conns int) (int64, time.Duration, time.Duration, error) {
	addr, cmd, stop, err := start(self, server)
	if err != nil {
		return 0, 0, 0, err
	}
	defer stop()
	client := &fasthttp.HostClient{Addr: addr, MaxConns: conns}
	call := func(req *fasthttp.Request, resp *fasthttp.Response) bool {
		return client.Do(req, resp) == nil && resp.StatusCode() == http.StatusOK
	}
	var n, failed atomic.Int64
	load := func(until time.Time, count bool) {
		var wg sync.WaitGroup
		for range conns {
			wg.Add(1)
			go func() {
				defer wg.Done()
				req, resp := checkRequest(addr), fasthttp.AcquireResponse()
				defer fasthttp.ReleaseRequest(req)
				defer fasthttp.ReleaseResponse(resp)
				for time.Now().Before(until) {
					ok := call(req, resp)
					if count && ok {
						n.Add(1)
					} else if count {
						failed.Add(1)
					}
				}
			}()
		}
		wg.Wait()
	}
	load(time.Now().Add(time.Second), false) // warm up: connections, buffers
	cpu0, start := cputime.Of(cmd.Process.Pid), time.Now()
	load(start.Add(d), true)
	elapsed, cpu := time.Since(start), cputime.Of(cmd.Process.Pid)-cpu0
	if f := failed.Load(); f > 0 {
		return 0, 0, 0, fmt.Errorf("%s: %d requests failed", server, f)
	}
	return n.Load(), cpu, elapsed, nil
}

// serveWith serves POST /v1/check on a loopback port and prints the address.
func serveWith(server string) error {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return err
	}
	fmt.Println(ln.Addr())
	switch server {
	case "nethttp":
		mux := http.NewServeMux()
		mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
			var c checkBody
			if err := json.NewDecoder(io.LimitReader(r.Body, 8<<10)).Decode(&c); err != nil {
				http.Error(w, err.Error(), http.StatusBadRequest)
				return
			}
			h := w.Header()
			h.Set("X-Request-Id", "0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6a7b")
			h.Set("Content-Type", "application/json")
			h.Set("Content-Length", strconv.Itoa(len(answer)))
			_, _ = w.Write(answer)
		})
		return (&http.Server{Handler: mux, ReadHeaderTimeout: 5 * time.Second}).Serve(ln)
	case "fasthttp":
		return (&fasthttp.Server{Handler: func(ctx *fasthttp.RequestCtx) {
			if string(ctx.Path()) != "/v1/check" || !ctx.IsPost() {
				ctx.SetStatusCode(http.StatusNotFound)
				return
			}
			var c checkBody
			if err := json.Unmarshal(ctx.PostBody(), &c); err != nil {
				ctx.Error(err.Error(), http.StatusBadRequest)
				return
			}
			ctx.Response.Header.Set("X-Request-Id", "0192b3c4-d5e6-7f80-9a1b-2c3d4e5f6a7b")
			ctx.SetContentType("application/json")
			ctx.SetBody(answer)
		}}).Serve(ln)
	case "grpc":
		return serveGRPC(ln)
	case "grpcfast":
		return serveGRPCFast(ln)
	default:
		return fmt.Errorf("-serve: %q is not nethttp, fasthttp, grpc or grpcfast", server)
	}
}
