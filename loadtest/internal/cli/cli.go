// Package cli is the main of the load-test commands: a context cancelled on
// SIGINT or SIGTERM, and exit status 1 with the error logged when run fails.
package cli

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"
)

// Main runs run until it returns or a signal cancels its context; an error
// is logged on log (slog's default when nil) under name, and the process
// exits with status 1.
func Main(log *slog.Logger, name string, run func(ctx context.Context) error) {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	err := run(ctx)
	stop()
	if err != nil {
		if log == nil {
			log = slog.Default()
		}
		log.Error(name, "err", err)
		os.Exit(1)
	}
}
