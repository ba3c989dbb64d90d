// Command adjuster scales limits from system health (CPU, memory, error rate,
// abuse rate), serves the SREs' admin API, and replays what-if simulations.
package main

import (
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/adjuster/internal/app"
)

func main() { service.Main("adjuster", app.Run) }
