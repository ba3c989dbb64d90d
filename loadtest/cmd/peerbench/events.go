package main

import (
	"context"
	"fmt"
	"net/http"
	"time"

	"github.com/prometheus/common/expfmt"
	"github.com/prometheus/common/model"

	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
)

// deliveries reads, once the limiter's async producer has emptied its
// buffer (at most 30 s), what became of its decision events: sent to Kafka,
// refused, failed after retries, dropped by the journal.
func deliveries(ctx context.Context, httpAddr string, calls int64) (envoypeer.Events, error) {
	ev := envoypeer.Events{Calls: calls}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := scrape(ctx, "http://"+httpAddr+"/metrics")
		if err != nil {
			return ev, err
		}
		ev.Sent, ev.Dropped, ev.Failed = m["floodgate_stream_async_sent_total"], m["floodgate_stream_async_dropped_total"], m["floodgate_stream_async_failed_total"]
		ev.JournalDropped = m["floodgate_stream_journal_dropped_total"]
		if m["floodgate_stream_async_queued"] == 0 && m["floodgate_stream_journal_pending"] == 0 || time.Now().After(deadline) {
			return ev, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}

// scrape sums each metric of a Prometheus text exposition over its labels.
func scrape(ctx context.Context, url string) (map[string]float64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	parser := expfmt.NewTextParser(model.UTF8Validation)
	families, err := parser.TextToMetricFamilies(resp.Body)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	out := map[string]float64{}
	for name, f := range families {
		for _, m := range f.GetMetric() {
			switch {
			case m.GetCounter() != nil:
				out[name] += m.GetCounter().GetValue()
			case m.GetGauge() != nil:
				out[name] += m.GetGauge().GetValue()
			}
		}
	}
	return out, nil
}
