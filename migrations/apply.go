package migrations

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Runner applies migrations to the backends it holds; a nil backend is skipped.
type Runner struct {
	Kafka  *Kafka
	Dynamo *Dynamo
	Influx *Influx
	Now    func() time.Time
	Report func(string) // one line per change or check; must not be nil
}

// ErrChecksum means an applied migration file was edited afterwards.
var ErrChecksum = errors.New("applied migration changed")

// Apply reconciles every backend against every migration, in version order.
// The ledger is written only when all three backends took part, so a partial
// run (say, Kafka only in a test) never marks a migration applied.
func (r *Runner) Apply(ctx context.Context, ms []Migration) error {
	var applied map[int]Record
	if r.Dynamo != nil {
		if err := r.Dynamo.ensureLedger(ctx, func(string) {}); err != nil {
			return err
		}
		var err error
		if applied, err = r.Dynamo.Records(ctx); err != nil {
			return err
		}
		for _, m := range ms {
			if rec, ok := applied[m.Version]; ok && rec.Checksum != m.Checksum {
				return fmt.Errorf("%w: %s was applied %s with checksum %.12s, the file now has %.12s; add a new migration instead of editing it",
					ErrChecksum, m.File, rec.AppliedAt.Format(time.RFC3339), rec.Checksum, m.Checksum)
			}
		}
	}
	for _, m := range ms {
		r.Report(fmt.Sprintf("migration %04d_%s", m.Version, m.Name))
		if r.Kafka != nil {
			if err := r.Kafka.Apply(ctx, m.Kafka.Topics, r.Report); err != nil {
				return fmt.Errorf("migration %d: %w", m.Version, err)
			}
		}
		if r.Dynamo != nil {
			if err := r.Dynamo.Apply(ctx, m.DynamoDB.Tables, r.Report); err != nil {
				return fmt.Errorf("migration %d: %w", m.Version, err)
			}
		}
		if r.Influx != nil {
			if err := r.Influx.Apply(ctx, m.InfluxDB.Databases, r.Report); err != nil {
				return fmt.Errorf("migration %d: %w", m.Version, err)
			}
		}
		if r.Kafka != nil && r.Dynamo != nil && r.Influx != nil {
			if _, ok := applied[m.Version]; !ok {
				if err := r.Dynamo.Record(ctx, m, r.Now()); err != nil {
					return err
				}
				r.Report(fmt.Sprintf("migration %04d_%s: recorded in the ledger", m.Version, m.Name))
			}
		}
	}
	return nil
}
