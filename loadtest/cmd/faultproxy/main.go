// Command faultproxy is a TCP proxy in front of one Redis node, in a process
// of its own, for fault scenarios: the chaos run drives it over HTTP. In the
// chaos process, the proxy's goroutines queued behind the load generator's,
// and the harness's own scheduling delay counted as Redis latency.
//
//	faultproxy -listen 127.0.0.1:0 -upstream 127.0.0.1:6379 -control 127.0.0.1:0
//
// It prints "proxy <addr> control <addr>" once both listen. Control:
// POST /delay?d=40ms (every reply held 40 ms after it arrived; 0 removes it),
// POST /stall?d=60ms (nothing passes for 60 ms), GET /accepted (client
// connections accepted so far), GET /late ("<n> <ns>": delayed replies
// passed on more than 2 ms late, and the latest by how many ns), GET
// /upstream ("<n> <ns>": replies that came from Redis more than 2 ms after
// their request, before any delay, and the slowest).
package main

import (
	"flag"
	"fmt"
	"log"
	"net"
	"net/http"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
)

func main() {
	upstream := flag.String("upstream", "", "Redis address to forward to")
	control := flag.String("control", "127.0.0.1:0", "loopback address of the HTTP control endpoint")
	flag.Parse()
	if *upstream == "" {
		log.Fatal("faultproxy: -upstream is required")
	}
	px, err := redistest.StartProxy(*upstream)
	if err != nil {
		log.Fatalf("faultproxy: %v", err)
	}
	defer px.Close()
	ln, err := net.Listen("tcp", *control)
	if err != nil {
		log.Fatalf("faultproxy: control: %v", err)
	}
	duration := func(w http.ResponseWriter, r *http.Request) (time.Duration, bool) {
		d, err := time.ParseDuration(r.URL.Query().Get("d"))
		if err != nil || d < 0 || d > time.Minute {
			http.Error(w, "d: a duration in 0..1m", http.StatusBadRequest)
			return 0, false
		}
		return d, true
	}
	mux := http.NewServeMux()
	mux.HandleFunc("POST /delay", func(w http.ResponseWriter, r *http.Request) {
		if d, ok := duration(w, r); ok {
			px.SetDelay(d)
		}
	})
	mux.HandleFunc("POST /stall", func(w http.ResponseWriter, r *http.Request) {
		if d, ok := duration(w, r); ok {
			px.Stall(d)
		}
	})
	mux.HandleFunc("GET /accepted", func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte(strconv.FormatInt(px.Accepted(), 10)))
	})
	mux.HandleFunc("GET /late", func(w http.ResponseWriter, _ *http.Request) {
		n, most := px.Late()
		_, _ = fmt.Fprintf(w, "%d %d", n, most.Nanoseconds())
	})
	mux.HandleFunc("GET /upstream", func(w http.ResponseWriter, _ *http.Request) {
		n, most := px.Upstream()
		_, _ = fmt.Fprintf(w, "%d %d", n, most.Nanoseconds())
	})
	fmt.Printf("proxy %s control %s\n", px.Addr, ln.Addr())
	log.Fatal((&http.Server{Handler: mux, ReadHeaderTimeout: time.Second}).Serve(ln))
}
