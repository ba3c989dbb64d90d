package benchreport

import (
	"bytes"
	"context"
	_ "embed"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"text/template"
	"time"
)

//go:embed benchmarks.md.tmpl
var defaultTemplate string

// SectionResult is a section as it ran.
type SectionResult struct {
	Section
	Ran                   bool // selected and run (false: left out with -only)
	Started               time.Time
	Elapsed               time.Duration
	LoadBefore, LoadAfter float64
	Steps                 []*StepResult
}

// Failed reports whether a step of the section failed.
func (s *SectionResult) Failed() bool {
	for _, r := range s.Steps {
		if r.Failed() {
			return true
		}
	}
	return false
}

// Report is a run of the suite, ready to be written.
type Report struct {
	Machine  Machine
	Command  string // how the report was made, e.g. "make bench"
	Quick    bool
	Sections []*SectionResult
	PlotDir  string // the directory of plots and raw outputs, relative to the Markdown file ("bench")

	charts map[string][]byte // file name in PlotDir → SVG
	values map[string]Val
	errs   []string // charts that could not be drawn
}

// Run runs the selected sections in order. A step shared by sections runs
// once; its result is shown in each.
func Run(ctx context.Context, r *Runner, sections []Section, selected func(string) bool) []*SectionResult {
	done := map[*Step]*StepResult{}
	var out []*SectionResult
	for _, s := range sections {
		sr := &SectionResult{Section: s}
		out = append(out, sr)
		if !selected(s.Name) {
			continue
		}
		sr.Ran, sr.Started, sr.LoadBefore = true, time.Now().UTC(), LoadAverage()
		for _, st := range s.Steps {
			res, ok := done[st]
			if !ok {
				res = r.Run(ctx, st)
				done[st] = res
			}
			sr.Steps = append(sr.Steps, res)
		}
		sr.Elapsed, sr.LoadAfter = time.Since(sr.Started), LoadAverage()
	}
	return out
}

// Failed reports whether any section that ran failed.
func (rep *Report) Failed() bool {
	for _, s := range rep.Sections {
		if s.Ran && s.Failed() {
			return true
		}
	}
	return false
}

// Build extracts the values, tables and charts of the report.
func (rep *Report) Build() {
	rep.charts = map[string][]byte{}
	rep.values = map[string]Val{}
	if rep.PlotDir == "" {
		rep.PlotDir = "bench"
	}
	for _, s := range rep.Sections {
		for _, r := range s.Steps {
			extract(r, rep.values)
		}
	}
	ran := map[string]bool{}
	for _, s := range rep.Sections {
		ran[s.Name] = s.Ran
	}
	for name, c := range charts(rep.values, rep.Sections) {
		if sec, _, _ := strings.Cut(name, "-"); !ran[sec] {
			continue // charts are named after their section: limiter-latency.svg
		}
		b, err := c.SVG()
		if err != nil {
			rep.errs = append(rep.errs, fmt.Sprintf("%s: %v", name, err))
			continue
		}
		rep.charts[name] = b
	}
}

// Chart is a chart of the report.
type Chart interface{ SVG() ([]byte, error) }

// Markdown renders the report with tmpl (the embedded
// benchmarks.md.tmpl when empty).
func (rep *Report) Markdown(tmpl string) (string, error) {
	if rep.values == nil {
		rep.Build()
	}
	if tmpl == "" {
		tmpl = defaultTemplate
	}
	bySection := map[string]*SectionResult{}
	for _, s := range rep.Sections {
		bySection[s.Name] = s
	}
	funcs := template.FuncMap{
		"section":        sectionFunc(bySection, rep.sectionMarkdown),
		"sectionSummary": sectionFunc(bySection, rep.sectionSummary),
		"sectionSteps":   sectionFunc(bySection, rep.sectionSteps),
		"v": func(key string) string {
			v, ok := rep.values[key]
			if !ok {
				return "(not measured)"
			}
			return v.String()
		},
		"has":     func(key string) bool { _, ok := rep.values[key]; return ok },
		"targets": rep.targetsMarkdown,
		"machine": rep.machineMarkdown,
		"plot":    rep.plotMarkdown,
	}
	t, err := template.New("benchmarks.md").Funcs(funcs).Option("missingkey=error").Parse(tmpl)
	if err != nil {
		return "", fmt.Errorf("parse template: %w", err)
	}
	var b bytes.Buffer
	if err := t.Execute(&b, rep); err != nil {
		return "", fmt.Errorf("render template: %w", err)
	}
	return b.String(), nil
}

// Write writes the Markdown to out, and the charts and raw outputs to
// PlotDir beside it.
func (rep *Report) Write(out, tmpl string) error {
	if rep.values == nil {
		rep.Build()
	}
	dir := filepath.Join(filepath.Dir(out), rep.PlotDir)
	if err := os.MkdirAll(dir, 0o755); err != nil {
		return fmt.Errorf("plots directory: %w", err)
	}
	for name, b := range rep.charts {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("write chart: %w", err)
		}
	}
	for _, s := range rep.Sections {
		for _, r := range s.Steps {
			if r.RawFile != "" {
				continue // shared with an earlier section
			}
			r.RawFile = r.Step.ID + ".txt"
			if err := os.WriteFile(filepath.Join(dir, r.RawFile), r.Output, 0o644); err != nil {
				return fmt.Errorf("write raw output: %w", err)
			}
		}
	}
	md, err := rep.Markdown(tmpl)
	if err != nil {
		return err
	}
	if err := os.WriteFile(out, []byte(md), 0o644); err != nil {
		return fmt.Errorf("write report: %w", err)
	}
	return nil
}

// Charts returns the rendered charts by file name.
func (rep *Report) Charts() map[string][]byte { return rep.charts }

// WriteCharts builds the report and writes only its plots into dir.
func (rep *Report) WriteCharts(dir string) error {
	rep.Build()
	if len(rep.errs) > 0 {
		return fmt.Errorf("plots: %s", strings.Join(rep.errs, "; "))
	}
	for name, b := range rep.charts {
		if err := os.WriteFile(filepath.Join(dir, name), b, 0o644); err != nil {
			return fmt.Errorf("write plot: %w", err)
		}
	}
	return nil
}

func (rep *Report) machineMarkdown() string {
	m := rep.Machine
	var b strings.Builder
	dirty := ""
	if m.Dirty {
		dirty = " (dirty: uncommitted changes in the tree)"
	}
	row := func(k, v string) { fmt.Fprintf(&b, "| %s | %s |\n", k, v) }
	b.WriteString("| | |\n| --- | --- |\n")
	row("date", m.Date.Format("2006-01-02 15:04 MST"))
	row("command", "`"+rep.Command+"`")
	row("git commit", "`"+m.Commit+"`"+dirty)
	row("host", m.Host)
	row("CPU", fmt.Sprintf("%d × %s", m.Cores, m.CPU))
	row("memory", fmt.Sprintf("%.1f GiB", m.MemoryGB))
	row("kernel", m.Kernel)
	row("Go", m.Go)
	if len(m.Stack) > 0 {
		row("local stack", strings.Join(m.Stack, "<br>"))
	}
	var loads []string
	for _, s := range rep.Sections {
		if s.Ran {
			loads = append(loads, fmt.Sprintf("%s %s → %s", s.Name, fmtLoad(s.LoadBefore), fmtLoad(s.LoadAfter)))
		}
	}
	row("1-min load average before → after each section", strings.Join(loads, "; "))
	if rep.Quick {
		row("mode", "**-quick**: short benchtimes and load runs, for checking the generator; not numbers to quote")
	}
	return b.String()
}

func fmtLoad(l float64) string {
	if l < 0 {
		return "?"
	}
	return fmt.Sprintf("%.2f", l)
}

func (rep *Report) plotMarkdown(name, alt string) string {
	if _, ok := rep.charts[name]; !ok {
		return fmt.Sprintf("_(no plot %s: %s)_\n", name, rep.chartErr(name))
	}
	return fmt.Sprintf("![%s](%s/%s)\n", alt, rep.PlotDir, name)
}

func (rep *Report) chartErr(name string) string {
	for _, e := range rep.errs {
		if strings.HasPrefix(e, name+":") {
			return strings.TrimPrefix(e, name+": ")
		}
	}
	return "its benchmark did not run"
}

// sectionFunc is a template function that renders the named section with
// render.
func sectionFunc(bySection map[string]*SectionResult, render func(*SectionResult) string) func(string) (string, error) {
	return func(name string) (string, error) {
		s, ok := bySection[name]
		if !ok {
			return "", fmt.Errorf("template: no section %q", name)
		}
		return render(s), nil
	}
}

// sectionMarkdown is the generated part of a section: its summary tables
// and plots, then each command with its run, load and full results. The
// template may take the two apart (sectionSummary, then sectionSteps) to put
// prose between them.
func (rep *Report) sectionMarkdown(s *SectionResult) string {
	return rep.sectionSummary(s) + rep.sectionSteps(s)
}

// sectionSummary is the first part of sectionMarkdown: when the section
// ran, its load and its summary tables and plots.
func (rep *Report) sectionSummary(s *SectionResult) string {
	if !s.Ran {
		return "_Not run in this report (left out with `-only`)._\n"
	}
	var b strings.Builder
	fmt.Fprintf(&b, "Ran %s for %s; 1-minute load average %s before, %s after.\n\n", s.Started.Format("2006-01-02 15:04:05 MST"),
		s.Elapsed.Round(time.Second), fmtLoad(s.LoadBefore), fmtLoad(s.LoadAfter))
	if s.Failed() {
		b.WriteString("**FAILED**: a command of this section failed; its results below are partial or missing.\n\n")
	}
	b.WriteString(summary(s.Name, rep))
	return b.String()
}

// sectionSteps is the rest of sectionMarkdown: each command with its run,
// load and full results (nothing when the section did not run).
func (rep *Report) sectionSteps(s *SectionResult) string {
	if !s.Ran {
		return ""
	}
	var b strings.Builder
	for _, r := range s.Steps {
		fmt.Fprintf(&b, "#### %s\n\n```sh\n%s\n```\n\n", r.Step.Title, strings.Join(r.Step.CommandLines(), "\n"))
		fmt.Fprintf(&b, "Ran %s for %s; load average %s → %s.", r.Started.Format("15:04:05 MST"), r.Elapsed.Round(100*time.Millisecond),
			fmtLoad(r.LoadBefore), fmtLoad(r.LoadAfter))
		if r.RawFile != "" {
			fmt.Fprintf(&b, " Raw output: [%s](%s/%s).", r.RawFile, rep.PlotDir, r.RawFile)
		}
		b.WriteString("\n\n")
		if r.Failed() {
			fmt.Fprintf(&b, "**FAILED**: %s\n\nLast lines of its output:\n\n```\n%s\n```\n\n", mdEscape(r.Err.Error()), r.Tail(30))
		}
		switch {
		case r.Step.Kind == GoBench && len(r.Bench.Benchmarks) > 0:
			b.WriteString(benchTable(r.Bench))
			b.WriteString(benchLogs(r.Bench))
		case r.Step.Kind == GoTest && !r.Failed():
			b.WriteString("**PASS**\n\n")
		case r.Step.Kind == LoadGen && r.HTTP != nil:
			b.WriteString(httpTable(r.HTTP))
		case r.Step.Kind == Quality && r.Quality != nil:
			b.WriteString(qualityTable(r.Quality))
		case r.Step.Kind == Peer && r.Peer != nil:
			b.WriteString(peerTable(r.Peer))
		}
	}
	return b.String()
}

func mdEscape(s string) string { return strings.ReplaceAll(s, "|", `\|`) }
