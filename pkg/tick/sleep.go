package tick

import (
	"context"
	"time"
)

// Sleep waits for d or until ctx is done and reports whether it waited the
// whole d (false: ctx is done). A d of zero or less does not wait.
func Sleep(ctx context.Context, d time.Duration) bool {
	if d <= 0 {
		return ctx.Err() == nil
	}
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
		return false
	}
}
