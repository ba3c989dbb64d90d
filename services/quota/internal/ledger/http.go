package ledger

import (
	"context"
	"errors"
	"fmt"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// MaxDays is the longest window the usage API and CLI return.
const MaxDays = 400

// UsageReader reads a principal's ledger: *Store.
type UsageReader interface {
	Usage(ctx context.Context, principal string, from, to time.Time) ([]DayUsage, error)
}

var _ UsageReader = (*Store)(nil)

// Report is a principal's usage over the last days, oldest first; the last
// day is today (UTC).
type Report struct {
	Principal string     `json:"principal"`
	Today     int64      `json:"today"`
	Total     int64      `json:"total"`
	Days      []DayUsage `json:"days"`
}

// ErrBadRequest is wrapped by UsageReport's errors about its arguments.
var ErrBadRequest = errors.New("bad usage request")

// UsageReport validates the principal and days and reads the ledger for the
// last days days, today included.
func UsageReport(ctx context.Context, r UsageReader, kind, id string, days int, now time.Time) (Report, error) {
	p := events.Principal{Kind: events.PrincipalKind(kind), ID: id}
	if err := p.Validate(); err != nil {
		return Report{}, fmt.Errorf("%w: principal: %w", ErrBadRequest, err)
	}
	if days < 1 || days > MaxDays {
		return Report{}, fmt.Errorf("%w: days %d: must be in 1..%d", ErrBadRequest, days, MaxDays)
	}
	to := now.UTC()
	from := to.Add(-time.Duration(days-1) * 24 * time.Hour)
	list, err := r.Usage(ctx, p.Key(), from, to)
	if err != nil {
		return Report{}, err
	}
	rep := Report{Principal: p.Key(), Days: list}
	for _, d := range list {
		rep.Total += d.Units
	}
	if len(list) > 0 {
		rep.Today = list[len(list)-1].Units
	}
	return rep, nil
}
