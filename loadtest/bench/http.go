// Package bench measures the limiter over HTTP: open-loop runs at fixed offered
// rates (latency measured from each request's intended start, so a stalled server
// is charged for the requests it delayed — no coordinated omission) and a
// closed-loop run at saturation.
package bench

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
)

// Target is the check endpoint and the bodies to send, cycled in order. With
// Batch > 1 each body is a POST /v1/check/batch of Batch checks.
type Target struct {
	URL    string
	Bodies [][]byte
	Batch  int // checks per request
	Client *http.Client
}

// NewTarget returns a target sending checks for n principals to base
// (http://host:port), batch checks per request (1: POST /v1/check, more: POST
// /v1/check/batch).
func NewTarget(base string, n, conns, batch int) *Target {
	batch = max(batch, 1)
	t := &Target{
		URL:   base + "/v1/check",
		Batch: batch,
		Client: &http.Client{Timeout: 5 * time.Second, Transport: &http.Transport{
			MaxIdleConns: conns, MaxIdleConnsPerHost: conns, MaxConnsPerHost: conns, IdleConnTimeout: time.Minute,
		}},
	}
	check := func(i int) string {
		return fmt.Sprintf(`{"principal":{"kind":"bot","id":"bench_%06d"},"ip":"203.0.113.%d","method":"POST","route":"/channels/{channel_id}/messages","resource":"channel:%d"}`,
			i, 1+i%250, i%1000)
	}
	if batch == 1 {
		for i := 0; i < n; i++ {
			t.Bodies = append(t.Bodies, []byte(check(i)))
		}
		return t
	}
	t.URL += "/batch"
	for i := 0; i < max(n/batch, 1); i++ {
		checks := make([]string, batch)
		for j := range checks {
			checks[j] = check((i*batch + j) % n)
		}
		t.Bodies = append(t.Bodies, []byte(`{"checks":[`+strings.Join(checks, ",")+`]}`))
	}
	return t
}

// Result summarises one run. Latencies are in microseconds.
type Result struct {
	Name     string
	Batch    int     // checks per request
	Offered  float64 // requests/s asked for; 0 for a closed-loop run
	Achieved float64 // responses/s
	Requests int64
	Errors   int64
	Hist     *hdrhistogram.Histogram
	Elapsed  time.Duration
}

// Quantile returns a latency quantile (0..100).
func (r Result) Quantile(q float64) time.Duration {
	return time.Duration(r.Hist.ValueAtQuantile(q)) * time.Microsecond
}

func newHist() *hdrhistogram.Histogram { return hdrhistogram.New(1, 60_000_000, 3) }

// workerPool is goroutines that each record latencies into a histogram of
// their own, merged into one as each ends.
type workerPool struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	hist *hdrhistogram.Histogram
}

// startWorkers starts n goroutines running work.
func startWorkers(n int, work func(local *hdrhistogram.Histogram)) *workerPool {
	p := &workerPool{hist: newHist()}
	for range n {
		p.wg.Add(1)
		go func() {
			defer p.wg.Done()
			local := newHist()
			work(local)
			p.mu.Lock()
			p.hist.Merge(local)
			p.mu.Unlock()
		}()
	}
	return p
}

// wait waits for every worker to end and returns their merged histogram.
func (p *workerPool) wait() *hdrhistogram.Histogram {
	p.wg.Wait()
	return p.hist
}

// do sends one check and reports whether it got a 200.
func (t *Target) do(ctx context.Context, i int64) bool {
	body := t.Bodies[int(i%int64(len(t.Bodies)))]
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, t.URL, bytes.NewReader(body))
	if err != nil {
		return false
	}
	req.Header.Set("Content-Type", "application/json")
	resp, err := t.Client.Do(req)
	if err != nil {
		return false
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()
	return resp.StatusCode == http.StatusOK
}

// OpenLoop offers rate requests/s for d with up to workers requests in flight.
// Each request's latency runs from when it should have been sent, so queueing
// behind a slow server shows up in the tail instead of lowering the offered load.
func (t *Target) OpenLoop(ctx context.Context, rate float64, d time.Duration, workers int) Result {
	interval := time.Duration(float64(time.Second) / rate)
	total := int64(d / interval)
	jobs := make(chan time.Time, workers*4)
	var errs, seq atomic.Int64
	p := startWorkers(workers, func(local *hdrhistogram.Histogram) {
		for intended := range jobs {
			ok := t.do(ctx, seq.Add(1))
			if !ok {
				errs.Add(1)
			}
			_ = local.RecordValue(time.Since(intended).Microseconds())
		}
	})
	start := time.Now()
	for i := int64(0); i < total && ctx.Err() == nil; i++ {
		intended := start.Add(time.Duration(i) * interval)
		if wait := time.Until(intended); wait > 0 {
			time.Sleep(wait)
		}
		jobs <- intended // blocks only when every worker is busy and the queue is full: latency keeps counting
	}
	close(jobs)
	hist := p.wait()
	elapsed := time.Since(start)
	return Result{Name: fmt.Sprintf("open %.0f/s", rate), Batch: t.Batch, Offered: rate, Achieved: float64(hist.TotalCount()) / elapsed.Seconds(),
		Requests: hist.TotalCount(), Errors: errs.Load(), Hist: hist, Elapsed: elapsed}
}

// ClosedLoop runs workers back-to-back senders for d: throughput at saturation.
func (t *Target) ClosedLoop(ctx context.Context, d time.Duration, workers int) Result {
	ctx, cancel := context.WithTimeout(ctx, d)
	defer cancel()
	var errs, seq atomic.Int64
	start := time.Now()
	p := startWorkers(workers, func(local *hdrhistogram.Histogram) {
		for ctx.Err() == nil {
			s := time.Now()
			ok := t.do(ctx, seq.Add(1))
			if ctx.Err() != nil {
				break // the deadline cut this request short: not a server error
			}
			if !ok {
				errs.Add(1)
			}
			_ = local.RecordValue(time.Since(s).Microseconds())
		}
	})
	hist := p.wait()
	elapsed := time.Since(start)
	return Result{Name: fmt.Sprintf("closed, %d workers", workers), Batch: t.Batch, Achieved: float64(hist.TotalCount()) / elapsed.Seconds(),
		Requests: hist.TotalCount(), Errors: errs.Load(), Hist: hist, Elapsed: elapsed}
}

// Markdown renders results as a table; rates are requests/s, and checks/s is
// requests/s × checks per request.
func Markdown(rs []Result) string {
	var b bytes.Buffer
	b.WriteString("| run | checks/req | offered req/s | achieved req/s | checks/s | requests | errors | p50 | p99 | p99.9 | max |\n|---|---|---|---|---|---|---|---|---|---|---|\n")
	for _, r := range rs {
		offered := "—"
		if r.Offered > 0 {
			offered = fmt.Sprintf("%.0f", r.Offered)
		}
		fmt.Fprintf(&b, "| %s | %d | %s | %.0f | %.0f | %d | %d | %s | %s | %s | %s |\n", r.Name, max(r.Batch, 1), offered, r.Achieved,
			r.Achieved*float64(max(r.Batch, 1)), r.Requests, r.Errors,
			r.Quantile(50), r.Quantile(99), r.Quantile(99.9), time.Duration(r.Hist.Max())*time.Microsecond)
	}
	return b.String()
}

// Run is one result in machine-readable form (loadgen -json): rates in
// requests/s (each request carries Batch checks), latencies in milliseconds.
type Run struct {
	Name     string  `json:"name"`
	Batch    int     `json:"checks_per_request"`
	Closed   bool    `json:"closed"` // the closed-loop saturation run
	Offered  float64 `json:"offered_per_s"`
	Achieved float64 `json:"achieved_per_s"`
	Requests int64   `json:"requests"`
	Errors   int64   `json:"errors"`
	Seconds  float64 `json:"seconds"`
	P50      float64 `json:"p50_ms"`
	P90      float64 `json:"p90_ms"`
	P99      float64 `json:"p99_ms"`
	P999     float64 `json:"p99_9_ms"`
	Max      float64 `json:"max_ms"`
}

// Report is what loadgen -json writes: the settings of the sweep and its runs.
type Report struct {
	URL        string  `json:"url"`
	Duration   float64 `json:"duration_s"` // per run
	Principals int     `json:"principals"`
	Batch      int     `json:"checks_per_request"` // 1: POST /v1/check; more: POST /v1/check/batch
	Workers    int     `json:"workers"`            // open-loop requests in flight
	SatWorkers int     `json:"saturation_workers"`
	Runs       []Run   `json:"runs"`
}

// Run returns r in machine-readable form.
func (r Result) Run() Run {
	ms := func(us int64) float64 { return float64(us) / 1000 }
	return Run{Name: r.Name, Batch: max(r.Batch, 1), Closed: r.Offered == 0, Offered: r.Offered, Achieved: r.Achieved,
		Requests: r.Requests, Errors: r.Errors, Seconds: r.Elapsed.Seconds(),
		P50: ms(r.Hist.ValueAtQuantile(50)), P90: ms(r.Hist.ValueAtQuantile(90)), P99: ms(r.Hist.ValueAtQuantile(99)),
		P999: ms(r.Hist.ValueAtQuantile(99.9)), Max: ms(r.Hist.Max())}
}
