// Command adjuster scales limits from system health (CPU, memory, error rate,
// abuse rate), serves the SREs' admin API, and replays what-if simulations.
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	config.SetMemoryLimit(ctx, log)
	if err := app.Run(ctx, os.Args[1:], os.Getenv, os.Stdout, log); err != nil {
		log.Error("adjuster stopped", "err", err)
		os.Exit(1)
	}
}
