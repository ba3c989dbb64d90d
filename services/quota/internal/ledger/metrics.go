package ledger

import (
	"github.com/prometheus/client_golang/prometheus"

	"github.com/floodgate-dev/floodgate/pkg/metric"
)

// Metrics are the floodgate_quota_* collectors.
type Metrics struct {
	Messages     *prometheus.CounterVec // result
	Units        prometheus.Counter
	Writes       *prometheus.CounterVec // kind, outcome
	WriteErrors  prometheus.Counter
	FencedUnits  prometheus.Counter
	Flushes      prometheus.Counter
	FlushSeconds prometheus.Histogram
	LedgerLag    prometheus.Histogram
	Reseeds      *prometheus.CounterVec // outcome
	DLQ          prometheus.Counter
	OverDayBound prometheus.Counter
	Abandoned    prometheus.Counter
}

// Commits, rebalances, lag and dead letters by class are the stream's:
// floodgate_stream_commits_total, floodgate_stream_rebalances_total,
// floodgate_stream_partition_lag, floodgate_stream_dlq_total{topic,class}
// (labels topic and group).

// Message results (label result of floodgate_quota_messages_total).
const (
	resultAllowed       = "allowed"        // allowed decision, units aggregated
	resultDenied        = "denied"         // denied decision, no units
	resultDuplicate     = "duplicate"      // a decision id seen moments ago at another offset
	resultPoison        = "poison"         // undecodable, dead-lettered
	resultReplay        = "replay"         // replay of this group's dead letter, aggregated
	resultReplayIgnored = "replay_ignored" // replay of another group's dead letter
)

// NewMetrics registers the quota metrics on reg.
func NewMetrics(reg prometheus.Registerer) *Metrics {
	f := metric.With(reg)
	return &Metrics{
		Messages: f.CounterVec("floodgate_quota_messages_total",
			"Decision messages handled, by result: allowed, denied, duplicate, poison, replay, replay_ignored.", "result"),
		Units: f.Counter("floodgate_quota_units_total",
			"Allowed units aggregated from the stream (before fencing; redeliveries count again)."),
		Writes: f.CounterVec("floodgate_quota_ledger_writes_total",
			"Conditional UpdateItem calls answered by DynamoDB, by kind (partition, replay).", "kind"),
		WriteErrors: f.Counter("floodgate_quota_ledger_write_errors_total",
			"UpdateItem calls that failed (throttling, network) and were retried with backoff."),
		FencedUnits: f.Counter("floodgate_quota_fenced_units_total",
			"Units not written because the ledger already held their offsets (redeliveries, replays seen before)."),
		Flushes: f.Counter("floodgate_quota_flushes_total", "Partition batches written to the ledger and committed."),
		FlushSeconds: f.Histogram("floodgate_quota_flush_seconds",
			"Duration of one partition flush: ledger writes, re-seed and commit.", prometheus.ExponentialBuckets(0.001, 2, 15)),
		LedgerLag: f.Histogram("floodgate_quota_ledger_lag_seconds",
			"Age of the oldest message of a batch (its Kafka timestamp) when the batch's flush completed.", prometheus.ExponentialBuckets(0.01, 2, 14)),
		Reseeds: f.CounterVec("floodgate_quota_reseeds_total",
			"Redis day counters re-seeded from the ledger, by outcome (ok, error).", "outcome"),
		DLQ: f.Counter("floodgate_quota_dlq_total",
			"Decisions the ledger refused (undecodable, outside the event-time window, a replayed reference); the stream dead-letters them."),
		OverDayBound: f.Counter("floodgate_quota_over_day_bound_total",
			"Allowed decisions dead-lettered, not counted, because they would charge their principal past its daily bound (FLOODGATE_EVENT_DAY_QUOTAS plus FLOODGATE_EVENT_DAY_SLACK)."),
		Abandoned: f.Counter("floodgate_quota_abandoned_total",
			"Batches not flushed by the drain or rebalance deadline (left uncommitted, redelivered, fenced)."),
	}
}
