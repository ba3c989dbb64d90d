// Command detector scores the decision stream for abuse and writes penalties the limiter applies.
package main

import (
	"context"

	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/detector/internal/app"
)

// The detector's app still drains on its own (its wiring is being changed on
// another branch); the runner gives it signals, the log level, the memory
// limit and its tracing.
func main() {
	service.Main("detector", func(ctx context.Context, env service.Env) error {
		return app.Run(ctx, env.Getenv, env.Log, env.Tracing)
	})
}
