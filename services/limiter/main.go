// Command limiter answers gateways' rate-limit checks and publishes every decision.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/floodgate-dev/floodgate/services/limiter/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := app.Run(ctx, os.Getenv, log); err != nil {
		log.Error("limiter stopped", "err", err)
		os.Exit(1)
	}
}
