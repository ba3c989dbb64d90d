// Command detector scores the decision stream for abuse and writes penalties the limiter applies.
package main

import (
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/detector/internal/app"
)

func main() { service.Main("detector", app.Run) }
