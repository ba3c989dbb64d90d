package stream

import (
	"cmp"
	"log/slog"
	"time"

	"github.com/cenkalti/backoff/v5"
)

func (c *Consumer) newBackoff() *backoff.ExponentialBackOff {
	return newBackoff(c.cfg.InitialBackoff, c.cfg.MaxBackoff)
}

// BackoffDefaults fills in zero backoff bounds: initial defaults to
// DefaultInitialBackoff, maxInterval to DefaultMaxBackoff or initial,
// whichever is larger.
func BackoffDefaults(initial, maxInterval time.Duration) (time.Duration, time.Duration) {
	initial = cmp.Or(initial, DefaultInitialBackoff)
	return initial, cmp.Or(maxInterval, max(DefaultMaxBackoff, initial))
}

// newBackoff is a jittered exponential backoff from initial up to maxInterval.
func newBackoff(initial, maxInterval time.Duration) *backoff.ExponentialBackOff {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval = initial
	bo.MaxInterval = maxInterval
	bo.Reset()
	return bo
}

// OrDiscard returns l, or a logger that discards everything when l is nil
// (the default of every Logger field in this package and pkg/journal).
func OrDiscard(l *slog.Logger) *slog.Logger {
	if l == nil {
		return slog.New(slog.DiscardHandler)
	}
	return l
}
