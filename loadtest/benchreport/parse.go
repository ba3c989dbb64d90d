package benchreport

import (
	"bufio"
	"fmt"
	"io"
	"regexp"
	"strconv"
	"strings"

	"golang.org/x/perf/benchfmt"
)

// Benchmark is one result line of `go test -bench`, with the units as printed.
type Benchmark struct {
	Pkg    string  // import path, from the "pkg:" line before it
	Name   string  // without the GOMAXPROCS suffix: "BenchmarkLedger/steady/10k-per-s/500-principals"
	Procs  int     // GOMAXPROCS of the run (the -N suffix; 1 when there is none)
	Iters  int     // b.N
	Values []Value // in the order printed: ns/op first, then B/s, custom metrics, B/op, allocs/op
	Log    []string
}

// Value is one measurement of a benchmark line.
type Value struct {
	Value float64
	Unit  string // as printed: ns/op, MB/s, B/op, allocs/op, events/s, p99_ms …
}

// Get returns the value with unit, and whether the line has it.
func (b Benchmark) Get(unit string) (float64, bool) {
	for _, v := range b.Values {
		if v.Unit == unit {
			return v.Value, true
		}
	}
	return 0, false
}

// Output is a parsed `go test -bench` output.
type Output struct {
	Benchmarks []Benchmark
	Config     map[string]string // goos, goarch, cpu, pkg (the last one)
	Failures   []string          // "--- FAIL", "FAIL", "panic:" lines
}

// Find returns the first benchmark whose name is name.
func (o Output) Find(name string) (Benchmark, bool) {
	for _, b := range o.Benchmarks {
		if b.Name == name {
			return b, true
		}
	}
	return Benchmark{}, false
}

var (
	// resultTail is what follows the name on a result line: iterations, then value-unit pairs.
	resultTail  = regexp.MustCompile(`^\s*\d+\s+[-+0-9.eE]+\s+\S+`)
	procsSuffix = regexp.MustCompile(`-(\d+)$`)
)

// ParseGoBench parses the combined output of `go test -bench` with
// golang.org/x/perf/benchfmt. The benchmark's own output to stderr (a slog
// line, a warning) can land between a result's name, printed before the
// benchmark runs, and its numbers, printed after: such a split line is put
// back together before parsing, and the text in between is dropped.
func ParseGoBench(r io.Reader) (Output, error) {
	out := Output{Config: map[string]string{}}
	var repaired strings.Builder
	logs := map[string][]string{} // full name with procs → b.Log lines
	var logName string
	pending := "" // a result name whose numbers have not come yet
	s := bufio.NewScanner(r)
	s.Buffer(make([]byte, 1<<20), 16<<20)
	for s.Scan() {
		line := s.Text()
		if logName != "" && strings.HasPrefix(line, "    ") {
			logs[logName] = append(logs[logName], strings.TrimSpace(line))
			continue
		}
		logName = ""
		switch {
		case strings.HasPrefix(line, "--- BENCH: "):
			logName = strings.TrimSpace(strings.TrimPrefix(line, "--- BENCH: "))
			continue
		case strings.HasPrefix(line, "--- FAIL: "), strings.HasPrefix(line, "FAIL"), strings.HasPrefix(line, "panic: "):
			out.Failures = append(out.Failures, strings.TrimSpace(line))
		}
		if strings.HasPrefix(line, "Benchmark") {
			name, rest, _ := strings.Cut(line, "\t")
			name = strings.TrimSpace(name)
			if f := strings.Fields(name); len(f) > 1 { // "BenchmarkX-2 " padding without a tab
				name, rest = f[0], strings.TrimPrefix(strings.TrimSpace(line), f[0])
			}
			if resultTail.MatchString(rest) {
				pending = ""
				repaired.WriteString(name + "\t" + strings.TrimSpace(rest) + "\n")
				continue
			}
			pending = name
			if i := strings.Index(rest, "--- FAIL: "); i >= 0 {
				out.Failures = append(out.Failures, strings.TrimSpace(rest[i:]))
				pending = ""
			}
			continue
		}
		if pending != "" && resultTail.MatchString(line) {
			repaired.WriteString(pending + "\t" + strings.TrimSpace(line) + "\n")
			pending = ""
			continue
		}
		if strings.HasPrefix(line, "goos:") || strings.HasPrefix(line, "goarch:") ||
			strings.HasPrefix(line, "pkg:") || strings.HasPrefix(line, "cpu:") {
			repaired.WriteString(line + "\n")
		}
	}
	if err := s.Err(); err != nil {
		return out, fmt.Errorf("read benchmark output: %w", err)
	}

	br := benchfmt.NewReader(strings.NewReader(repaired.String()), "go test output")
	for br.Scan() {
		switch rec := br.Result().(type) {
		case *benchfmt.SyntaxError:
			return out, fmt.Errorf("parse benchmark output: %w", rec)
		case *benchfmt.Result:
			full := "Benchmark" + string(rec.Name.Full())
			b := Benchmark{Pkg: rec.GetConfig("pkg"), Name: full, Procs: 1, Iters: rec.Iters, Log: logs[full]}
			if m := procsSuffix.FindStringSubmatch(full); m != nil {
				b.Procs, _ = strconv.Atoi(m[1])
				b.Name = strings.TrimSuffix(full, m[0])
			}
			for _, v := range rec.Values {
				if v.OrigUnit != "" {
					b.Values = append(b.Values, Value{Value: v.OrigValue, Unit: v.OrigUnit})
				} else {
					b.Values = append(b.Values, Value{Value: v.Value, Unit: v.Unit})
				}
			}
			for _, c := range rec.Config {
				out.Config[c.Key] = string(c.Value)
			}
			out.Benchmarks = append(out.Benchmarks, b)
		}
	}
	if err := br.Err(); err != nil {
		return out, fmt.Errorf("parse benchmark output: %w", err)
	}
	return out, nil
}
