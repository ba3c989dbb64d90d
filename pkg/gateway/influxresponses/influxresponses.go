// Package influxresponses writes a gateway's responses by status class to
// InfluxDB (measurement http_responses), the adjuster's error-rate signal:
// set gateway.Options.Responses to New(…) and Run it.
package influxresponses

import (
	"context"
	"sync"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api"

	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// Counter counts responses by class (1xx…5xx) and writes them to InfluxDB
// as the http_responses measurement the adjuster's error-rate signal reads
// (docs/adjuster.md): one point per class per flush, tags code_class and service,
// integer field count = responses since the previous point. No paths, principals
// or IPs are written.
type Counter struct {
	w       api.WriteAPI
	service string
	now     func() time.Time

	mu     sync.Mutex
	counts [5]int64 // 1xx … 5xx since the last flush
}

var _ gateway.ResponseCounter = (*Counter)(nil)

// New returns a counter writing through client to org/bucket for service.
func New(client influxdb2.Client, org, bucket, service string, now func() time.Time) *Counter {
	return &Counter{w: client.WriteAPI(org, bucket), service: service, now: now}
}

// Count records one response; statuses outside 100..599 are ignored.
func (r *Counter) Count(status int) {
	if status < 100 || status > 599 {
		return
	}
	r.mu.Lock()
	r.counts[status/100-1]++
	r.mu.Unlock()
}

// Flush writes the counts since the last flush (classes with none are omitted).
func (r *Counter) Flush() {
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
func (r *Counter) Run(ctx context.Context, every time.Duration) error {
	_ = tick.Every(ctx, every, func(context.Context) { r.Flush() })
	r.Flush()
	return nil
}
