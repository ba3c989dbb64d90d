package chaos

import (
	"fmt"
	"runtime"
	"strings"
	"time"
)

// Metric is one measured value of a scenario.
type Metric struct{ Name, Value string }

// Invariant is a property the scenario requires after the fault.
type Invariant struct {
	Name   string
	OK     bool
	Detail string
}

// Result is one scenario's outcome.
type Result struct {
	Name       string
	Fault      string
	Metrics    []Metric
	Invariants []Invariant
	Elapsed    time.Duration
	Err        error // the scenario could not run to the end
	Logs       string
}

func (r *Result) metric(name, format string, args ...any) {
	r.Metrics = append(r.Metrics, Metric{name, fmt.Sprintf(format, args...)})
}

func (r *Result) require(name string, ok bool, format string, args ...any) {
	r.Invariants = append(r.Invariants, Invariant{name, ok, fmt.Sprintf(format, args...)})
}

// OK reports whether the scenario ran and every invariant held.
func (r Result) OK() bool {
	if r.Err != nil {
		return false
	}
	for _, i := range r.Invariants {
		if !i.OK {
			return false
		}
	}
	return true
}

// Line is the one-line summary of a result.
func (r Result) Line() string {
	var b strings.Builder
	status := "PASS"
	if !r.OK() {
		status = "FAIL"
	}
	fmt.Fprintf(&b, "%s %s (%.1fs):", status, r.Name, r.Elapsed.Seconds())
	for _, m := range r.Metrics {
		fmt.Fprintf(&b, " %s=%s;", m.Name, m.Value)
	}
	if r.Err != nil {
		fmt.Fprintf(&b, " error=%v", r.Err)
	}
	return strings.TrimSuffix(b.String(), ";")
}

// Markdown renders the results as the report of docs/chaos.md.
func Markdown(results []Result, command string, started time.Time) string {
	var b strings.Builder
	fmt.Fprintf(&b, "Run %s with `%s` on %s (%d CPUs, %s/%s, %s).\n\n", started.UTC().Format("2006-01-02 15:04 MST"),
		command, hostname(), runtime.NumCPU(), runtime.GOOS, runtime.GOARCH, runtime.Version())
	b.WriteString("| scenario | fault | result | invariants |\n| --- | --- | --- | --- |\n")
	for _, r := range results {
		var ms, inv []string
		for _, m := range r.Metrics {
			ms = append(ms, fmt.Sprintf("%s: **%s**", m.Name, m.Value))
		}
		if r.Err != nil {
			ms = append(ms, "error: "+strings.ReplaceAll(r.Err.Error(), "|", "/"))
		}
		for _, i := range r.Invariants {
			mark := "✅"
			if !i.OK {
				mark = "❌"
			}
			inv = append(inv, fmt.Sprintf("%s %s (%s)", mark, i.Name, i.Detail))
		}
		fmt.Fprintf(&b, "| %s (%.0f s) | %s | %s | %s |\n", r.Name, r.Elapsed.Seconds(), r.Fault,
			strings.Join(ms, "<br>"), strings.Join(inv, "<br>"))
	}
	return b.String()
}
