// Command quota keeps the exact daily quota ledger: it consumes decisions,
// writes each principal's allowed units per UTC day to DynamoDB exactly once,
// re-seeds the limiter's Redis day counters from it, and serves usage.
//
//	quota                             run the service
//	quota usage bot:abc --days 7      print a principal's usage
package main

import (
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/quota/internal/app"
)

func main() { service.Main("quota", app.Run) }
