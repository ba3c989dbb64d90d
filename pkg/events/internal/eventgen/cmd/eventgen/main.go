// Command eventgen writes pkg/events' *_gen.go files from the JSON Schemas.
// Run by `go generate ./pkg/events` (see pkg/events/doc.go).
package main

import (
	"flag"
	"fmt"
	"os"
	"path/filepath"
	"strings"

	"github.com/floodgate-dev/floodgate/pkg/events/internal/eventgen"
)

func main() {
	if err := run(os.Args[1:]); err != nil {
		fmt.Fprintln(os.Stderr, "eventgen:", err)
		os.Exit(1)
	}
}

func run(args []string) error {
	fs := flag.NewFlagSet("eventgen", flag.ContinueOnError)
	schemas := fs.String("schemas", "../../schemas", "directory of the event schemas (*.vN.json)")
	out := fs.String("out", ".", "directory of package events")
	if err := fs.Parse(args); err != nil {
		return err
	}
	files, err := eventgen.Generate(*schemas)
	if err != nil {
		return err
	}
	// Remove generated files no schema produces any more.
	old, err := filepath.Glob(filepath.Join(*out, "*_gen.go"))
	if err != nil {
		return err
	}
	for _, p := range old {
		if _, ok := files[filepath.Base(p)]; !ok && strings.HasSuffix(p, "_gen.go") {
			if err := os.Remove(p); err != nil {
				return err
			}
		}
	}
	for name, src := range files {
		if err := os.WriteFile(filepath.Join(*out, name), src, 0o644); err != nil {
			return err
		}
	}
	return nil
}
