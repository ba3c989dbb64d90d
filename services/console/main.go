// Command console is the web console where trust-and-safety staff review abuse
// alerts and act on penalties, and SREs look at the pipeline's state.
//
//	console                       serve on FLOODGATE_CONSOLE_ADDR (127.0.0.1:8090)
//	console user add NAME ROLE    hash a password (read from stdin) and print the users-file entry
//	console token add NAME ROLE   make an API token and print it with its users-file entry
package main

import (
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/services/console/internal/app"
)

func main() { service.Main("console", app.Run) }
