package auditor

import (
	"context"
	"log/slog"
	"time"

	influxdb2 "github.com/influxdata/influxdb-client-go/v2"
	"github.com/influxdata/influxdb-client-go/v2/api/write"
	"github.com/segmentio/kafka-go"
)

// PointWriter queues InfluxDB points; the influxdb-client-go WriteAPI is one.
// It must not block and must be safe for concurrent use.
type PointWriter interface {
	WritePoint(p *write.Point)
}

// Ingester is the handler of every DLQ topic's consumer: it stores a redacted
// copy of each dead letter, counts it in InfluxDB and feeds the alerter.
type Ingester struct {
	Store   *Store
	Points  PointWriter
	Alerter *Alerter
	TTL     time.Duration
	Now     func() time.Time
	Logger  *slog.Logger
	Metrics *Metrics
}

// MeasurementDLQRecords is the InfluxDB measurement of dead letters.
const MeasurementDLQRecords = "dlq_records"

// Handle stores one message read from a DLQ topic. It returns an error only
// when the record could not be stored (the consumer retries it); it never
// returns a permanent error, since a dead-letter topic has no dead-letter
// topic of its own: a malformed record is stored as ClassInvalidRecord.
func (in *Ingester) Handle(ctx context.Context, msg kafka.Message) error {
	rec := fromMessage(msg, in.Now(), in.TTL)
	created, err := in.Store.Put(ctx, &rec)
	if err != nil {
		in.Metrics.storeErrors.Inc()
		return err
	}
	// One point per dead letter. Its timestamp carries the record's
	// coordinates below the millisecond, so a redelivered record overwrites
	// its own point instead of counting twice.
	in.Points.WritePoint(influxdb2.NewPoint(MeasurementDLQRecords,
		map[string]string{"topic": rec.SourceTopic, "service": rec.Service, "class": rec.Class},
		map[string]any{"count": 1, "attempts": rec.Attempts},
		pointTime(&rec)))
	if !created {
		in.Metrics.redelivered.WithLabelValues(rec.SourceTopic).Inc()
		return nil
	}
	in.Metrics.records.WithLabelValues(rec.SourceTopic, rec.Service, rec.Class).Inc()
	in.Alerter.Observe(rec.SourceTopic, rec.Service, rec.Class, rec.DeadLetteredAt)
	in.Logger.Info("dead letter stored", "id", rec.ID, "source_topic", rec.SourceTopic,
		"partition", rec.SourcePartition, "offset", rec.SourceOffset, "service", rec.Service,
		"class", rec.Class, "group", rec.ConsumerGroup)
	return nil
}

// pointTime is the dead-lettering time (ms) plus, in the sub-millisecond
// nanoseconds, the DLQ offset and partition modulo 1000.
func pointTime(r *Record) time.Time {
	return r.DeadLetteredAt.Truncate(time.Millisecond).Add(time.Duration((r.DLQOffset%1000)*1000 + int64(r.DLQPartition%1000)))
}
