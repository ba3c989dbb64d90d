// Command deferred is the deferred-work worker: it consumes
// floodgate.deferred.v1 in a consumer group and replays each deferred request
// to its upstream at the pace its rule allows, exactly once, before its
// deadline, keeping the result in Redis for the client (docs/deferred.md).
package main

import (
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/deferred/internal/app"
)

func main() { service.Main("deferred", app.Run) }
