// Command dlq-auditor consumes every dead-letter topic, stores and counts the
// dead letters, pages when they come too fast, and serves the API (and is the
// API's command-line client) to inspect, replay, purge and account for them.
package main

import (
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/app"
)

func main() { service.Main("dlq-auditor", app.Run) }
