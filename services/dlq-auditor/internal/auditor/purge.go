package auditor

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
)

// PurgeRequest selects stored records to delete.
type PurgeRequest struct {
	IDs           []string
	Actor         string
	Role          string
	Reason        string
	CorrelationID string
}

// Purger deletes stored records, each together with its audit entry. The
// dead letter itself stays on its DLQ topic until retention removes it.
type Purger struct {
	Store   *Store
	Max     int
	Now     func() time.Time
	NewID   func() string
	Metrics *Metrics
}

// checkSelection is what a purge and a replay ask of their request: 1..max
// records and a reason for the audit log.
func checkSelection(ids []string, max int, reason string) error {
	if len(ids) == 0 || len(ids) > max {
		return fmt.Errorf("%w: select 1..%d records, got %d", ErrBadRequest, max, len(ids))
	}
	if strings.TrimSpace(reason) == "" {
		return fmt.Errorf("%w: a reason is required (it goes to the audit log)", ErrBadRequest)
	}
	return nil
}

// Purge deletes every selected record that is stored. It stops at the first
// storage error, reporting what was purged before it.
func (p *Purger) Purge(ctx context.Context, req PurgeRequest) (dlqapi.PurgeResult, error) {
	if err := checkSelection(req.IDs, p.Max, req.Reason); err != nil {
		return dlqapi.PurgeResult{}, err
	}
	for _, id := range req.IDs {
		if _, _, _, err := ParseID(id); err != nil {
			return dlqapi.PurgeResult{}, fmt.Errorf("%w: %w", ErrBadRequest, err)
		}
	}
	var res dlqapi.PurgeResult
	for _, id := range req.IDs {
		err := p.Store.Purge(ctx, id, AuditEntry{
			ID: p.NewID(), At: p.Now(), Actor: req.Actor, Role: req.Role, Action: ActionPurge,
			Subject: SubjectOf(id), Reason: req.Reason, CorrelationID: req.CorrelationID,
		})
		switch {
		case errors.Is(err, ErrNotFound):
			res.Items = append(res.Items, dlqapi.PurgeItem{ID: id, Status: StatusNotFound})
		case err != nil:
			return res, err
		default:
			res.Purged++
			p.Metrics.purged.Inc()
			res.Items = append(res.Items, dlqapi.PurgeItem{ID: id, Status: "purged"})
		}
	}
	return res, nil
}
