// Command console is the web console where trust-and-safety staff review abuse
// alerts and act on penalties, and SREs look at the pipeline's state.
//
//	console                       serve on FLOODGATE_CONSOLE_ADDR (127.0.0.1:8090)
//	console user add NAME ROLE    hash a password (read from stdin) and print the users-file entry
//	console token add NAME ROLE   make an API token and print it with its users-file entry
package main

import (
	"context"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/services/console/internal/app"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	log := slog.New(slog.NewJSONHandler(os.Stderr, nil))
	config.SetMemoryLimit(ctx, log)
	if err := app.Main(ctx, os.Args[1:], os.Getenv, os.Stdin, os.Stdout, log); err != nil {
		log.Error("console stopped", "err", err)
		os.Exit(1)
	}
}
