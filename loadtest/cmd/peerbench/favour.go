package main

import (
	"fmt"
	"os"
	"strconv"
	"strings"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cgroup"
)

// member is one process of the run put into the favoured cgroup.
type member struct {
	name string
	pid  int
}

// favour puts the run's own processes (this generator, the services, and
// the Redis and broker it started) into one cgroup of the highest CPU
// weight, as the chaos overload scenario does with its own: on a machine
// other work keeps busy, that work runs only in what they leave, so a
// round's figures are the service's and not its neighbours'. A shared
// Redis or broker (-redis / -broker HOST:PORT) is not moved: it is not the
// run's to move. The line returned says what was done, or why not; remove
// undoes it (nil when nothing was), and g is the cgroup (nil when none).
func favour(on bool, members []member, shared []string) (line string, g *cgroup.Group, remove func()) {
	if !on {
		return "not favoured (-favour=false): the run's processes share their cores with the machine's other work at equal weight", nil, nil
	}
	var pids []int
	var names []string
	for _, m := range members {
		if m.pid != 0 {
			pids = append(pids, m.pid)
			names = append(names, m.name+" "+strconv.Itoa(m.pid))
		}
	}
	g, err := cgroup.Favour(fmt.Sprintf("floodgate-peerbench-%d", os.Getpid()), pids...)
	if err != nil {
		// Unfavoured figures are still figures: the line says they are.
		return "NOT favoured (" + err.Error() + "): the run's processes share their cores with the machine's other work at equal weight", nil, nil
	}
	line = fmt.Sprintf("favoured: %s holds %s", g, strings.Join(names, ", "))
	if len(shared) > 0 {
		line += "; not moved (shared, not this run's): " + strings.Join(shared, ", ")
	}
	return line, g, func() {
		if err := g.Remove(); err != nil {
			fmt.Fprintf(os.Stderr, "peerbench: %v\n", err)
		}
	}
}
