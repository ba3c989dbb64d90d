// Command limiter answers gateways' rate-limit checks and publishes every decision.
package main

import (
	"context"
	_ "embed"
	"log/slog"
	"os"
	"os/signal"
	"runtime/debug"
	"syscall"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/services/limiter/internal/app"
)

// defaultRules is the grid served when FLOODGATE_LIMITER_RULES is unset.
//
//go:embed rate-limits.yaml
var defaultRules []byte

// defaultGCPercent replaces Go's GOGC=100 unless GOGC is set. The limiter's live
// heap is small (17.5 MB after a GC at saturation) and every check allocates, so
// at 100 it collected many times a second; at 400 a paired run gave 14–15k
// checks/s instead of ~9k, for a larger heap between collections (resident
// memory up to ~200 MB in a 10 s saturation run). docs/benchmarks.md.
const defaultGCPercent = 400

func main() {
	if os.Getenv("GOGC") == "" {
		debug.SetGCPercent(defaultGCPercent)
	}
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	config.SetMemoryLimit(ctx, log)
	if err := app.Run(ctx, os.Getenv, log, defaultRules); err != nil {
		log.Error("limiter stopped", "err", err)
		os.Exit(1)
	}
}
