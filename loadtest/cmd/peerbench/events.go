package main

import (
	"context"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
	"github.com/floodgate-dev/floodgate/loadtest/internal/promtext"
)

// deliveries reads, once the limiter's async producer has emptied its
// buffer (at most 30 s), what became of its decision events: sent to Kafka,
// refused, failed after retries, dropped by the journal.
func deliveries(ctx context.Context, httpAddr string, calls int64) (envoypeer.Events, error) {
	ev := envoypeer.Events{Calls: calls}
	deadline := time.Now().Add(30 * time.Second)
	for {
		m, err := promtext.Get(ctx, "http://"+httpAddr+"/metrics")
		if err != nil {
			return ev, err
		}
		sum := func(name string) float64 { v, _ := m.Sum(name); return v } // absent: none counted yet
		ev.Sent, ev.Dropped, ev.Failed = sum("floodgate_stream_async_sent_total"), sum("floodgate_stream_async_dropped_total"), sum("floodgate_stream_async_failed_total")
		ev.JournalDropped = sum("floodgate_stream_journal_dropped_total")
		if sum("floodgate_stream_async_queued") == 0 && sum("floodgate_stream_journal_pending") == 0 || time.Now().After(deadline) {
			return ev, nil
		}
		time.Sleep(200 * time.Millisecond)
	}
}
