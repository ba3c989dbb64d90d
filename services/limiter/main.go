// Command limiter answers gateways' rate-limit checks and publishes every decision.
package main

import (
	"context"
	_ "embed"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/floodgate-dev/floodgate/services/limiter/internal/app"
)

// defaultRules is the grid served when FLOODGATE_LIMITER_RULES is unset.
//
//go:embed rate-limits.yaml
var defaultRules []byte

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	if err := app.Run(ctx, os.Getenv, log, defaultRules); err != nil {
		log.Error("limiter stopped", "err", err)
		os.Exit(1)
	}
}
