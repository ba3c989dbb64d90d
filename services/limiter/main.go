// Command limiter answers gateways' rate-limit checks and publishes every decision.
package main

import (
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/limiter/internal/app"
)

func main() { service.Main("limiter", app.Run) }
