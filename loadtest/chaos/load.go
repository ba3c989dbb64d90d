package chaos

import (
	"context"
	"encoding/json"
	"fmt"
	"net/netip"
	"slices"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/valyala/fasthttp"
)

// Check is the outcome of one check the load generator sent.
type Check struct {
	Start   time.Time
	Latency time.Duration
	// Arrival is the answer's latency to the kernel's receive time at this
	// process's socket (gRPC over envoyclient.Wire; 0 when not known):
	// Latency less the wait in this process's own run queue.
	Arrival   time.Duration
	Principal events.Principal
	OK        bool   // answered 200 with a decision
	ID        string // the decision id (the event's ce_id)
	Allowed   bool
	Degraded  bool // X-RateLimit-Error set, or degraded in the answer (shed answers too)
	Shed      bool // X-RateLimit-Shed: answered from local state because the limiter was busy
	// PriorityShed: refused by priority shedding (the adjuster's shed level).
	PriorityShed bool
	Penalty      float64
	Priority     string // as sent ("" when none)
	// Dropped: answered as past its deadline (X-RateLimit-Error names it),
	// though this caller was still waiting.
	Dropped bool
	// Overloaded: not decided, answered UNAVAILABLE by the limiter's entry
	// gate (envoyrls.Overloaded); not OK — the gateway fails open on it.
	Overloaded bool
	// GaveUp: the caller's deadline passed while it waited for the answer
	// it had not read; the call was reset (gRPC). Its answer may still
	// have come (Load.AnsweredAfterGivingUp).
	GaveUp bool
}

// Load sends checks to a limiter at a fixed total rate from a pool of
// workers, each paced (open loop per worker), and records every outcome.
type Load struct {
	URL     string
	Rate    int // checks/s in total
	Workers int
	// Next returns the principal of the i-th check of worker w.
	Next  func(w, i int) events.Principal
	Route string
	// IP returns the client address of a check of p; nil: 198.51.100.23.
	IP func(p events.Principal) string
	// Priority returns the priority bucket of the i-th check of worker w
	// (critical, degraded, best_effort, bulk); nil: none sent.
	Priority func(w, i int) string
	// Deadline, when set, is each caller's: sent as X-Floodgate-Timeout-Ms
	// (over gRPC, as the call's deadline), and the caller stops waiting for
	// the answer after it (it fails open, as a gateway does). Zero: 2 s, no
	// header.
	Deadline time.Duration
	// GRPCAddr, when set, sends each check as Envoy's ShouldRateLimit to the
	// limiter's gRPC address instead of POST /v1/check, over Conns
	// connections shared by the workers (a worker cancels its call at the
	// deadline and keeps the connection, as Envoy does); Conns zero: one per
	// worker.
	GRPCAddr string
	Conns    int
	// CriticalCluster, over gRPC, sends the critical checks over Conns
	// connections of their own, each with envoyrls.MetadataPriority: as a
	// gateway sends its CRITICAL routes' calls, through a rate-limit cluster
	// of their own whose every call carries that metadata (each of its
	// workers with a connection to each cluster). False: every call shares
	// the Conns connections, the critical ones marked one by one.
	CriticalCluster bool
	// CriticalAddr, with CriticalCluster, is where the critical cluster's
	// connections go: a limiter of its own serving a gateway's CRITICAL
	// routes. Empty: GRPCAddr.
	CriticalAddr string
	// Rates and Slice, when both set, interleave offered rates: the k-th
	// Slice since the load started (Started) offers Rates[k%len(Rates)]
	// instead of Rate, each worker's calls staggered afresh at each slice's
	// start. Conditions interleaved so finely share a machine whose speed
	// drifts over seconds (docs/chaos.md, 2026-12-02 05:00–).
	Rates []int
	Slice time.Duration

	mu      sync.Mutex
	started time.Time // when Run started its workers
	results []Check
	// after: the critical cluster's calls given up on whose answers came
	// anyway (AnsweredAfterGivingUp).
	after    []Check
	err      error                        // the connections could not be set up
	send     func(w int) (sender, func()) // set by Open
	closeAll func()
	bodies   sync.Map // bodyKey → []byte: each distinct body is encoded once
}

// bodyKey names a check's body: the principal and priority (the route and
// the principal's address do not change during a run).
type bodyKey struct {
	p        events.Principal
	priority string
}

// Run sends checks until ctx is done.
//
// The client is fasthttp's: the generator shares the machine's cores with
// the limiter it measures, and every microsecond it spends is one the
// limiter does not get — which is most of what an overload run measures
// (docs/chaos.md, overload).
func (l *Load) Run(ctx context.Context) {
	if l.Open() != nil {
		return
	}
	send := l.send
	defer l.closeAll()
	start := time.Now()
	l.mu.Lock()
	l.started = start
	l.mu.Unlock()
	interleaved := len(l.Rates) > 0 && l.Slice > 0
	sliceOf := func(t time.Time) int {
		if !interleaved {
			return 0
		}
		return int(t.Sub(start) / l.Slice)
	}
	intervalOf := func(k int) time.Duration {
		rate := l.Rate
		if interleaved {
			rate = l.Rates[k%len(l.Rates)]
		}
		return time.Duration(float64(time.Second) * float64(l.Workers) / float64(max(rate, 1)))
	}
	route := l.Route
	if route == "" {
		route = "/v1/things"
	}
	var wg sync.WaitGroup
	for w := range l.Workers {
		wg.Add(1)
		go func() {
			defer wg.Done()
			local := make([]Check, 0, 1024)
			one, done := send(w)
			defer done()
			timer := time.NewTimer(0)
			<-timer.C
			k, interval := 0, intervalOf(0)
			next := start.Add(time.Duration(w) * interval / time.Duration(l.Workers))
			for i := 0; ctx.Err() == nil; i++ {
				if d := time.Until(next); d > 0 {
					timer.Reset(d)
					select {
					case <-ctx.Done():
					case <-timer.C:
					}
					if ctx.Err() != nil {
						break
					}
				}
				next = next.Add(interval)
				if kk := sliceOf(next); kk != k {
					// A slice of another rate: this worker's place in it.
					k, interval = kk, intervalOf(kk)
					next = start.Add(time.Duration(k)*l.Slice + time.Duration(w)*interval/time.Duration(l.Workers))
				}
				if time.Until(next) < -time.Second {
					next = time.Now() // do not burst to catch up after a long stall
				}
				prio := ""
				if l.Priority != nil {
					prio = l.Priority(w, i)
				}
				local = append(local, one(l.Next(w, i), route, prio))
			}
			l.mu.Lock()
			l.results = append(l.results, local...)
			l.mu.Unlock()
		}()
	}
	wg.Wait()
}

// Started is when Run started sending (zero before).
func (l *Load) Started() time.Time {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.started
}

// Open sets up the load's connections — over gRPC dialled, settled and
// each warmed by a call (grpcSenders) — so that a phase's clock can start
// on them; Run opens them itself when Open was not called. The error is
// also Err's.
func (l *Load) Open() error {
	if l.send != nil {
		return nil
	}
	send, closeAll, err := l.senders()
	if err != nil {
		l.mu.Lock()
		l.err = err
		l.mu.Unlock()
		return err
	}
	l.send, l.closeAll = send, closeAll
	return nil
}

// sender sends one check of p on route at priority and returns its outcome.
type sender func(p events.Principal, route, priority string) Check

// senders returns, for worker w, its sender and what releases it, and what
// closes the connections once every worker is done: fasthttp's client for
// POST /v1/check, or gRPC connections for ShouldRateLimit (GRPCAddr).
func (l *Load) senders() (func(w int) (sender, func()), func(), error) {
	if l.GRPCAddr != "" {
		return l.grpcSenders()
	}
	client := &fasthttp.HostClient{Addr: strings.TrimPrefix(l.URL, "http://"), MaxConns: l.Workers,
		ReadTimeout: 2 * time.Second, WriteTimeout: 2 * time.Second, MaxConnWaitTimeout: 2 * time.Second}
	return func(int) (sender, func()) {
		req, resp := l.request(), fasthttp.AcquireResponse()
		return func(p events.Principal, route, priority string) Check {
				return l.one(client, req, resp, p, route, priority)
			}, func() {
				fasthttp.ReleaseRequest(req)
				fasthttp.ReleaseResponse(resp)
			}
	}, client.CloseIdleConnections, nil
}

type checkBody struct {
	Principal events.Principal `json:"principal"`
	IP        string           `json:"ip"`
	Method    string           `json:"method"`
	Route     string           `json:"route"`
	Priority  string           `json:"priority,omitempty"`
}

type checkAnswer struct {
	ID                string  `json:"id"`
	Allowed           bool    `json:"allowed"`
	Degraded          bool    `json:"degraded"`
	PenaltyMultiplier float64 `json:"penalty_multiplier"`
	Headers           struct {
		Error string `json:"X-RateLimit-Error"`
		Shed  string `json:"X-RateLimit-Shed"`
	} `json:"headers"`
	Shed bool `json:"shed"`
}

// request is a worker's request, reused for each of its checks: the URI,
// method and headers set once, only the body changes.
func (l *Load) request() *fasthttp.Request {
	req := fasthttp.AcquireRequest()
	req.SetRequestURI(l.URL + "/v1/check")
	req.Header.SetMethod(fasthttp.MethodPost)
	req.Header.SetContentType("application/json")
	if l.Deadline > 0 {
		req.Header.Set("X-Floodgate-Timeout-Ms", strconv.FormatInt(l.Deadline.Milliseconds(), 10))
	}
	return req
}

// body is the encoded check of p at priority, encoded on first use.
func (l *Load) body(p events.Principal, route, priority string) []byte {
	k := bodyKey{p, priority}
	if b, ok := l.bodies.Load(k); ok {
		return b.([]byte)
	}
	ip := "198.51.100.23"
	if l.IP != nil {
		ip = l.IP(p)
	}
	b, _ := json.Marshal(checkBody{Principal: p, IP: ip, Method: "GET", Route: route, Priority: priority})
	l.bodies.Store(k, b)
	return b
}

// one sends one check on req and resp (the worker's) and records its outcome.
func (l *Load) one(client *fasthttp.HostClient, req *fasthttp.Request, resp *fasthttp.Response, p events.Principal, route, priority string) Check {
	req.SetBodyRaw(l.body(p, route, priority))
	resp.Reset()
	timeout := 2 * time.Second
	if l.Deadline > 0 {
		timeout = l.Deadline
	}
	c := Check{Start: time.Now(), Principal: p, Priority: priority}
	if err := client.DoTimeout(req, resp, timeout); err == nil && resp.StatusCode() == fasthttp.StatusOK {
		var out checkAnswer
		if json.Unmarshal(resp.Body(), &out) == nil {
			c.OK, c.ID, c.Allowed, c.Penalty = true, out.ID, out.Allowed, out.PenaltyMultiplier
			c.Degraded = out.Headers.Error != "" || out.Degraded
			c.Shed = out.Headers.Shed != ""
			c.PriorityShed = out.Shed
			c.Dropped = strings.Contains(out.Headers.Error, "deadline exceeded")
		}
	}
	c.Latency = time.Since(c.Start)
	return c
}

// Err is why Run sent nothing: its connections could not be set up.
func (l *Load) Err() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.err
}

// Results returns every check sent (after Run returned).
func (l *Load) Results() []Check {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.results
}

// AnsweredAfterGivingUp returns the critical cluster's calls (gRPC, with
// CriticalCluster) that this process gave up on at their deadline and
// whose answers came anyway, each as answered when it reached this
// machine (Arrival): calls the limiter may have answered in time, read
// late because this process's reading goroutine waited for its CPU.
func (l *Load) AnsweredAfterGivingUp() []Check {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.after
}

// Window summarises the checks that started in [from, to).
type Window struct {
	Sent, Answered, Degraded, Allowed int
	P50, P99, Max                     time.Duration
}

// Summarise the checks that started in [from, to) (zero to: no end).
func Summarise(checks []Check, from, to time.Time) Window {
	var w Window
	var lat []time.Duration
	for _, c := range checks {
		if c.Start.Before(from) || (!to.IsZero() && !c.Start.Before(to)) {
			continue
		}
		w.Sent++
		lat = append(lat, c.Latency)
		if c.OK {
			w.Answered++
			if c.Degraded {
				w.Degraded++
			}
			if c.Allowed {
				w.Allowed++
			}
		}
	}
	if len(lat) > 0 {
		slices.Sort(lat)
		w.P50 = lat[len(lat)/2]
		w.P99 = lat[min(len(lat)-1, len(lat)*99/100)]
		w.Max = lat[len(lat)-1]
	}
	return w
}

// Availability is the share of checks answered, as a percentage string.
func (w Window) Availability() string {
	if w.Sent == 0 {
		return "n/a"
	}
	return fmt.Sprintf("%.2f %%", 100*float64(w.Answered)/float64(w.Sent))
}

func ms(d time.Duration) string { return fmt.Sprintf("%.1f ms", float64(d.Microseconds())/1000) }

// ipOf spreads normal traffic over a few documentation addresses.
func ipOf(i int) netip.Addr { return netip.AddrFrom4([4]byte{198, 51, 100, byte(i % 4)}) }
