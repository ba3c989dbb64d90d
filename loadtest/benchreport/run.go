package benchreport

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/bench"
	"github.com/floodgate-dev/floodgate/loadtest/envoypeer"
	"github.com/floodgate-dev/floodgate/loadtest/quality"
)

// StepKind says how a step's output is read.
type StepKind int

const (
	GoBench StepKind = iota // `go test -bench` output: benchmark lines
	GoTest                  // a test run: pass or fail
	LoadGen                 // loadgen -json: the file named by Step.JSON
	Quality                 // loadtest/cmd/quality -json: the file named by Step.JSON
	Peer                    // loadtest/cmd/peerbench -json: the file named by Step.JSON
)

// Step is one benchmark run of the suite: one or more commands run in order
// from the module root; the last one's output is the result.
type Step struct {
	ID       string // names its raw output file: <plots dir>/<ID>.txt
	Title    string
	Kind     StepKind
	Env      []string   // KEY=value added to the environment and shown before the command
	Commands [][]string // argv each
	JSON     string     // LoadGen, Quality: the -json file the last command writes
}

// CommandLines returns the commands as a shell would take them.
func (s *Step) CommandLines() []string {
	var out []string
	for _, c := range s.Commands {
		line := shellJoin(c)
		if len(s.Env) > 0 {
			line = strings.Join(s.Env, " ") + " " + line
		}
		out = append(out, line)
	}
	return out
}

// StepResult is what a step's run left.
type StepResult struct {
	Step       *Step
	Started    time.Time
	Elapsed    time.Duration
	LoadBefore float64
	LoadAfter  float64
	Output     []byte // combined stdout and stderr of every command
	RawFile    string // where Output was saved, relative to the report
	Err        error  // a command failed, or its output could not be read
	Bench      Output
	HTTP       *bench.Report
	Quality    *quality.Summary
	Peer       *envoypeer.Report
}

// Failed reports whether the step did not run to a usable result.
func (r *StepResult) Failed() bool { return r == nil || r.Err != nil }

// Tail returns the last n lines of the step's output.
func (r *StepResult) Tail(n int) string {
	lines := strings.Split(strings.TrimRight(string(r.Output), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// Runner runs steps as subprocesses.
type Runner struct {
	Dir      string    // module root: the commands' working directory
	Env      []string  // the environment (os.Environ() and defaults)
	Progress io.Writer // one line per command started and finished; nil: none
	Verbose  bool      // also copy every command's output to Progress
}

// Run runs every command of s, stopping at the first that fails.
func (r *Runner) Run(ctx context.Context, s *Step) *StepResult {
	res := &StepResult{Step: s, Started: time.Now().UTC(), LoadBefore: LoadAverage()}
	var out bytes.Buffer
	for i, argv := range s.Commands {
		line := s.CommandLines()[i]
		r.progress("benchreport: running %s", line)
		cmd := exec.CommandContext(ctx, argv[0], argv[1:]...)
		cmd.Dir = r.Dir
		cmd.Env = append(append([]string{}, r.Env...), s.Env...)
		cmd.WaitDelay = 10 * time.Second
		var w io.Writer = &out
		if r.Verbose && r.Progress != nil {
			w = io.MultiWriter(&out, r.Progress)
		}
		cmd.Stdout, cmd.Stderr = w, w
		t0 := time.Now()
		err := cmd.Run()
		r.progress("benchreport: %s after %s (load average %.2f)", status(err), time.Since(t0).Round(100*time.Millisecond), LoadAverage())
		if err != nil {
			res.Err = fmt.Errorf("%s: %w", line, err)
			break
		}
	}
	res.Elapsed = time.Since(res.Started)
	res.LoadAfter = LoadAverage()
	res.Output = out.Bytes()
	r.read(res)
	return res
}

// read fills res's results from its output and, for loadgen, its JSON file.
func (r *Runner) read(res *StepResult) {
	s := res.Step
	switch s.Kind {
	case GoBench:
		o, err := ParseGoBench(bytes.NewReader(res.Output))
		res.Bench = o
		if err != nil && res.Err == nil {
			res.Err = err
		}
		if res.Err == nil && len(o.Benchmarks) == 0 {
			res.Err = errors.New("no benchmark results in the output")
		}
	case LoadGen:
		if res.Err == nil {
			path := s.JSON
			if !filepath.IsAbs(path) {
				path = filepath.Join(r.Dir, path)
			}
			b, err := os.ReadFile(path)
			if err == nil {
				res.HTTP = &bench.Report{}
				err = json.Unmarshal(b, res.HTTP)
			}
			if err != nil {
				res.Err, res.HTTP = fmt.Errorf("read loadgen results: %w", err), nil
			}
		}
	case Quality:
		if res.Err == nil {
			res.Quality = &quality.Summary{}
			if err := r.readJSON(s.JSON, res.Quality); err != nil {
				res.Err, res.Quality = fmt.Errorf("read quality results: %w", err), nil
			}
		}
	case Peer:
		if res.Err == nil {
			res.Peer = &envoypeer.Report{}
			if err := r.readJSON(s.JSON, res.Peer); err != nil {
				res.Err, res.Peer = fmt.Errorf("read peerbench results: %w", err), nil
			}
		}
	case GoTest:
		if res.Err == nil && !bytes.Contains(res.Output, []byte("\nok ")) && !bytes.HasPrefix(res.Output, []byte("ok ")) {
			res.Err = errors.New("no passing test in the output")
		}
	}
}

func (r *Runner) readJSON(path string, v any) error {
	if !filepath.IsAbs(path) {
		path = filepath.Join(r.Dir, path)
	}
	b, err := os.ReadFile(path)
	if err != nil {
		return err
	}
	return json.Unmarshal(b, v)
}

// Reload reads the results of a report written earlier from its raw outputs
// in dataDir (<step>.txt, and the loadgen JSON files the steps name), without
// running anything: enough to redraw the plots (`benchreport -replot`).
// Times and load averages are not in the raw outputs and stay zero.
func (r *Runner) Reload(sections []Section, dataDir string) []*SectionResult {
	var out []*SectionResult
	done := map[*Step]*StepResult{}
	for _, s := range sections {
		sr := &SectionResult{Section: s, Ran: true}
		for _, st := range s.Steps {
			res, ok := done[st]
			if !ok {
				res = &StepResult{Step: st, RawFile: st.ID + ".txt"}
				var err error
				if res.Output, err = os.ReadFile(filepath.Join(dataDir, res.RawFile)); err != nil {
					res.Err = fmt.Errorf("read raw output: %w", err)
				} else {
					r.read(res)
				}
				done[st] = res
			}
			sr.Steps = append(sr.Steps, res)
		}
		out = append(out, sr)
	}
	return out
}

func status(err error) string {
	if err != nil {
		return "failed (" + err.Error() + ")"
	}
	return "done"
}

func (r *Runner) progress(format string, args ...any) {
	if r.Progress != nil {
		fmt.Fprintf(r.Progress, format+"\n", args...)
	}
}

// shellJoin quotes the words of argv that a POSIX shell would split or expand.
func shellJoin(argv []string) string {
	out := make([]string, len(argv))
	for i, a := range argv {
		if a != "" && strings.IndexFunc(a, func(r rune) bool {
			return !(r >= 'a' && r <= 'z' || r >= 'A' && r <= 'Z' || r >= '0' && r <= '9' || strings.ContainsRune("-_./=:,@+%", r))
		}) < 0 {
			out[i] = a
			continue
		}
		out[i] = "'" + strings.ReplaceAll(a, "'", `'\''`) + "'"
	}
	return strings.Join(out, " ")
}
