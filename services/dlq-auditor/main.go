// Command dlq-auditor consumes every dead-letter topic, stores and counts the
// dead letters, pages when they come too fast, and serves the API (and is the
// API's command-line client) to inspect, replay, purge and account for them.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	config.SetMemoryLimit(ctx, log)
	if err := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, log); err != nil {
		log.Error("dlq-auditor stopped", "err", err)
		os.Exit(1)
	}
}
