// Package tick runs periodic work: the one ticker loop of Floodgate's
// refreshers, flushers and sweepers.
package tick

import (
	"context"
	"time"
)

// Every calls fn every interval until ctx is done, then returns nil. The
// first call is one interval after the start; a call that outlasts the
// interval delays the next one (ticks are not queued). fn gets ctx.
func Every(ctx context.Context, interval time.Duration, fn func(ctx context.Context)) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			fn(ctx)
		}
	}
}
