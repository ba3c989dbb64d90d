package stream

import (
	"errors"
	"fmt"

	"github.com/prometheus/client_golang/prometheus"
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
	topicGroup := []string{"topic", "group"}
	m := &Metrics{
		consumed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_consumed_total",
			Help: "Messages finished by consumers, by outcome: ok (first attempt), retried (after retries), dlq (dead-lettered).",
		}, []string{"topic", "group", "outcome"}),
		retries: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_retries_total",
			Help: "Handler attempts that failed transiently and were retried.",
		}, topicGroup),
		handleSeconds: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "floodgate_stream_handle_seconds",
			Help:    "Duration of one handler invocation.",
			Buckets: prometheus.ExponentialBuckets(0.0001, 4, 9), // 100µs .. 6.5s
		}, topicGroup),
		batchMessages: prometheus.NewHistogramVec(prometheus.HistogramOpts{
			Name:    "floodgate_stream_batch_messages",
			Help:    "Messages per batch handed to a batch handler (batch mode).",
			Buckets: prometheus.ExponentialBuckets(1, 4, 10), // 1 .. 262144
		}, topicGroup),
		dlq: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_dlq_total",
			Help: "Messages dead-lettered, by source topic and error class.",
		}, []string{"topic", "class"}),
		dlqPublishErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_dlq_publish_errors_total",
			Help: "Failed attempts to publish to a dead-letter topic (retried until success).",
		}, []string{"topic"}),
		commits: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_commits_total",
			Help: "Successful offset commits.",
		}, topicGroup),
		commitErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_commit_errors_total",
			Help: "Failed offset commits (retried at the next commit interval).",
		}, topicGroup),
		fetchErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_fetch_errors_total",
			Help: "Errors returned by the reader's FetchMessage.",
		}, topicGroup),
		groupErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_group_errors_total",
			Help: "Errors joining or syncing the consumer group (retried).",
		}, topicGroup),
		redelivered: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_redelivered_skipped_total",
			Help: "Messages fetched again that this consumer had already taken in the same generation, skipped.",
		}, topicGroup),
		abandoned: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_abandoned_total",
			Help: "Handlers stopped by a drain or rebalance deadline; their messages are not committed and will be redelivered.",
		}, topicGroup),
		rebalances: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_rebalances_total",
			Help: "Consumer group generations joined.",
		}, topicGroup),
		lag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "floodgate_stream_lag",
			Help: "Messages behind the high watermark, summed over the partitions this consumer owns: high watermark minus the offset the group would resume from (a stuck partition shows its waiting messages).",
		}, topicGroup),
		partitionLag: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "floodgate_stream_partition_lag",
			Help: "Messages behind the high watermark per partition: high watermark minus the offset the group would resume from.",
		}, []string{"topic", "group", "partition"}),
		produced: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_produced_total",
			Help: "Messages written by reliable producers, by outcome (ok, error).",
		}, []string{"topic", "outcome"}),
		asyncSent: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_async_sent_total",
			Help: "Messages the async producer wrote to Kafka.",
		}, []string{"producer"}),
		asyncDropped: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_async_dropped_total",
			Help: "Messages the async producer refused in TryPublish (buffer full, or stopped).",
		}, []string{"producer", "reason"}),
		asyncFailed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "floodgate_stream_async_failed_total",
			Help: "Messages the async producer accepted but could not write (retries exhausted or drain deadline).",
		}, []string{"producer"}),
		asyncQueued: prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "floodgate_stream_async_queued",
			Help: "Messages waiting in the async producer's buffer.",
		}, []string{"producer"}),
	}
	if reg == nil {
		return m, nil
	}
	var errs []error
	m.consumed = register(reg, m.consumed, &errs)
	m.retries = register(reg, m.retries, &errs)
	m.handleSeconds = register(reg, m.handleSeconds, &errs)
	m.batchMessages = register(reg, m.batchMessages, &errs)
	m.dlq = register(reg, m.dlq, &errs)
	m.dlqPublishErrors = register(reg, m.dlqPublishErrors, &errs)
	m.commits = register(reg, m.commits, &errs)
	m.commitErrors = register(reg, m.commitErrors, &errs)
	m.fetchErrors = register(reg, m.fetchErrors, &errs)
	m.groupErrors = register(reg, m.groupErrors, &errs)
	m.redelivered = register(reg, m.redelivered, &errs)
	m.abandoned = register(reg, m.abandoned, &errs)
	m.rebalances = register(reg, m.rebalances, &errs)
	m.lag = register(reg, m.lag, &errs)
	m.partitionLag = register(reg, m.partitionLag, &errs)
	m.produced = register(reg, m.produced, &errs)
	m.asyncSent = register(reg, m.asyncSent, &errs)
	m.asyncDropped = register(reg, m.asyncDropped, &errs)
	m.asyncFailed = register(reg, m.asyncFailed, &errs)
	m.asyncQueued = register(reg, m.asyncQueued, &errs)
	if len(errs) > 0 {
		return nil, fmt.Errorf("register stream metrics: %w", errors.Join(errs...))
	}
	return m, nil
}

// register registers c on reg, or returns the collector of the same kind
// that is already registered under the same description.
func register[C prometheus.Collector](reg prometheus.Registerer, c C, errs *[]error) C {
	err := reg.Register(c)
	if err == nil {
		return c
	}
	var are prometheus.AlreadyRegisteredError
	if errors.As(err, &are) {
		if existing, ok := are.ExistingCollector.(C); ok {
			return existing
		}
	}
	*errs = append(*errs, err)
	return c
}
