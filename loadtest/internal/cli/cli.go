// Package cli is the main of the load-test commands: a context cancelled on
// SIGINT or SIGTERM, and exit status 1 with the error logged when run fails;
// and how they stop the services they started.
package cli

import (
	"context"
	"log/slog"
	"os"
	"os/exec"
	"os/signal"
	"syscall"
	"time"
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

// StopAll sends SIGTERM to every started process, then waits for each in
// turn up to grace, killing one that has not exited by then.
func StopAll(cmds []*exec.Cmd, grace time.Duration) {
	for _, c := range cmds {
		_ = c.Process.Signal(syscall.SIGTERM)
	}
	for _, c := range cmds {
		done := make(chan struct{})
		go func() { _ = c.Wait(); close(done) }()
		select {
		case <-done:
		case <-time.After(grace):
			_ = c.Process.Kill()
			<-done
		}
	}
}
