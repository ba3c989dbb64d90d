package stream

import (
	"fmt"
	"log/slog"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/metric"
)

// Metrics are the floodgate_stream_* collectors shared by every Consumer,
// Producer and AsyncProducer registered on one registry. They are labelled
// by topic and group (consumers) or producer name (async producers), so any
// number of them can share a registry.
type Metrics struct {
	consumed         *prometheus.CounterVec   // topic, group, outcome
	retries          *prometheus.CounterVec   // topic, group
	handleSeconds    *prometheus.HistogramVec // topic, group
	batchMessages    *prometheus.HistogramVec // topic, group
	dlq              *prometheus.CounterVec   // topic, class
	dlqPublishErrors *prometheus.CounterVec   // topic
	commits          *prometheus.CounterVec   // topic, group
	commitErrors     *prometheus.CounterVec   // topic, group
	fetchErrors      *prometheus.CounterVec   // topic, group
	groupErrors      *prometheus.CounterVec   // topic, group
	redelivered      *prometheus.CounterVec   // topic, group
	abandoned        *prometheus.CounterVec   // topic, group
	rebalances       *prometheus.CounterVec   // topic, group
	lag              *prometheus.GaugeVec     // topic, group
	partitionLag     *prometheus.GaugeVec     // topic, group, partition

	produced *prometheus.CounterVec // topic, outcome

	asyncSent    *prometheus.CounterVec // producer
	asyncDropped *prometheus.CounterVec // producer, reason
	asyncFailed  *prometheus.CounterVec // producer
	asyncQueued  *prometheus.GaugeVec   // producer
}

// Consumer outcomes (label outcome of floodgate_stream_consumed_total).
const (
	outcomeOK            = "ok"             // handled on the first attempt
	outcomeReplaySkipped = "replay_skipped" // a DLQ replay addressed to another consumer group
	outcomeRetried       = "retried"        // handled after at least one retry
	outcomeDLQ           = "dlq"            // dead-lettered
	outcomeError         = "error"          // (producer) not written
)

// Async drop reasons (label reason of floodgate_stream_async_dropped_total).
const (
	dropFull   = "full"   // the buffer was full
	dropClosed = "closed" // Run had already stopped
)

// NewMetrics creates the stream metrics and registers them on reg. Calling it
// again with the same registry returns metrics backed by the collectors
// already registered there, so it never fails on duplicates; it fails only
// when a different collector already uses one of the names. A nil reg gives
// working, unregistered metrics. NewConsumer, NewProducer and
// NewAsyncProducer call it with their Registerer; call it directly only to
// detect a name conflict at start-up.
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	v := metric.Shared(reg)
	tg := []string{"topic", "group"}
	m := &Metrics{
		consumed:         v.CounterVec("floodgate_stream_consumed_total", "Messages finished by consumers, by outcome: ok (first attempt), retried (after retries), dlq (dead-lettered).", "topic", "group", "outcome"),
		retries:          v.CounterVec("floodgate_stream_retries_total", "Handler attempts that failed transiently and were retried.", tg...),
		handleSeconds:    v.HistogramVec("floodgate_stream_handle_seconds", "Duration of one handler invocation.", prometheus.ExponentialBuckets(0.0001, 4, 9), tg...),                    // 100µs .. 6.5s
		batchMessages:    v.HistogramVec("floodgate_stream_batch_messages", "Messages per batch handed to a batch handler (batch mode).", prometheus.ExponentialBuckets(1, 4, 10), tg...), // 1 .. 262144
		dlq:              v.CounterVec("floodgate_stream_dlq_total", "Messages dead-lettered, by source topic and error class.", "topic", "class"),
		dlqPublishErrors: v.CounterVec("floodgate_stream_dlq_publish_errors_total", "Failed attempts to publish to a dead-letter topic (retried until success).", "topic"),
		commits:          v.CounterVec("floodgate_stream_commits_total", "Successful offset commits.", tg...),
		commitErrors:     v.CounterVec("floodgate_stream_commit_errors_total", "Failed offset commits (retried at the next commit interval).", tg...),
		fetchErrors:      v.CounterVec("floodgate_stream_fetch_errors_total", "Errors returned by the reader's FetchMessage.", tg...),
		groupErrors:      v.CounterVec("floodgate_stream_group_errors_total", "Errors joining or syncing the consumer group (retried).", tg...),
		redelivered:      v.CounterVec("floodgate_stream_redelivered_skipped_total", "Messages fetched again that this consumer had already taken in the same generation, skipped.", tg...),
		abandoned:        v.CounterVec("floodgate_stream_abandoned_total", "Handlers stopped by a drain or rebalance deadline; their messages are not committed and will be redelivered.", tg...),
		rebalances:       v.CounterVec("floodgate_stream_rebalances_total", "Consumer group generations joined.", tg...),
		lag:              v.GaugeVec("floodgate_stream_lag", "Messages behind the high watermark, summed over the partitions this consumer owns: high watermark minus the offset the group would resume from (a stuck partition shows its waiting messages).", tg...),
		partitionLag:     v.GaugeVec("floodgate_stream_partition_lag", "Messages behind the high watermark per partition: high watermark minus the offset the group would resume from.", "topic", "group", "partition"),
		produced:         v.CounterVec("floodgate_stream_produced_total", "Messages written by reliable producers, by outcome (ok, error).", "topic", "outcome"),
		asyncSent:        v.CounterVec("floodgate_stream_async_sent_total", "Messages the async producer wrote to Kafka.", "producer"),
		asyncDropped:     v.CounterVec("floodgate_stream_async_dropped_total", "Messages the async producer refused in TryPublish (buffer full, or stopped).", "producer", "reason"),
		asyncFailed:      v.CounterVec("floodgate_stream_async_failed_total", "Messages the async producer accepted but could not write (retries exhausted or drain deadline).", "producer"),
		asyncQueued:      v.GaugeVec("floodgate_stream_async_queued", "Messages waiting in the async producer's buffer.", "producer"),
	}
	if err := v.Err(); err != nil {
		return nil, fmt.Errorf("register stream metrics: %w", err)
	}
	return m, nil
}

// producerMetrics is NewMetrics for the producers, which do not fail for
// their metrics: when they cannot be registered on reg, why is logged and
// they are left unregistered.
func producerMetrics(reg prometheus.Registerer, log *slog.Logger) *Metrics {
	m, err := NewMetrics(reg)
	if err != nil {
		log.Error("stream metrics left unregistered", "err", err)
		m, _ = NewMetrics(nil)
	}
	return m
}
