package gateway

import (
	"context"
	"net/http"
	"sync"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api"
)

// ResponseCounter counts the responses a gateway sent, by status. Count must be
// safe for concurrent use and must not block.
type ResponseCounter interface {
	Count(status int)
}

// InfluxResponses counts responses by class (1xx…5xx) and writes them to InfluxDB
// as the http_responses measurement the adjuster's error-rate signal reads
// (docs/adjuster.md): one point per class per flush, tags code_class and service,
// integer field count = responses since the previous point. No paths, principals
// or IPs are written.
type InfluxResponses struct {
	w       api.WriteAPI
	service string
	now     func() time.Time

	mu     sync.Mutex
	counts [5]int64 // 1xx … 5xx since the last flush
}

var _ ResponseCounter = (*InfluxResponses)(nil)

// NewInfluxResponses returns a counter writing through client to org/bucket for service.
func NewInfluxResponses(client influxdb2.Client, org, bucket, service string, now func() time.Time) *InfluxResponses {
	return &InfluxResponses{w: client.WriteAPI(org, bucket), service: service, now: now}
}

// Count records one response; statuses outside 100..599 are ignored.
func (r *InfluxResponses) Count(status int) {
	if status < 100 || status > 599 {
		return
	}
	r.mu.Lock()
	r.counts[status/100-1]++
	r.mu.Unlock()
}

// Flush writes the counts since the last flush (classes with none are omitted).
func (r *InfluxResponses) Flush() {
	r.mu.Lock()
	counts := r.counts
	r.counts = [5]int64{}
	r.mu.Unlock()
	at := r.now()
	for i, n := range counts {
		if n == 0 {
			continue
		}
		class := string(rune('1'+i)) + "xx"
		r.w.WritePoint(influxdb2.NewPoint("http_responses",
			map[string]string{"code_class": class, "service": r.service},
			map[string]any{"count": n}, at))
	}
	r.w.Flush()
}

// Run flushes every interval until ctx is done, then flushes once more.
func (r *InfluxResponses) Run(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			r.Flush()
			return nil
		case <-t.C:
			r.Flush()
		}
	}
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (Flush, Hijack).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
