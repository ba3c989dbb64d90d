// Command quota keeps the exact daily quota ledger: it consumes decisions,
// writes each principal's allowed units per UTC day to DynamoDB exactly once,
// re-seeds the limiter's Redis day counters from it, and serves usage.
//
//	quota                             run the service
//	quota usage bot:abc --days 7      print a principal's usage
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/services/quota/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	config.SetMemoryLimit(ctx, log)
	if err := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, log); err != nil {
		log.Error("quota stopped", "err", err)
		os.Exit(1)
	}
}
