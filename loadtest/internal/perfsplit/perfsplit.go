// Package perfsplit sorts perf's samples of a process among time windows:
// where its CPU went during each of several loads offered in turn. One CPU
// profile per phase cannot show that when the machine's speed moves from
// one phase to the next (docs/chaos.md, overload, "interleaved"); samples
// taken across interleaved slices, each sorted into its slice by its time,
// give every load the same moments.
//
// The samples are perf's, not the Go runtime's profiler's: perf samples
// the kernel's frames too, at any rate (the runtime's profiler takes 100 a
// second of CPU, a few hundred per slice on a throttled core), and
// timestamps each sample with the clock the windows are in
// (`perf record -k CLOCK_MONOTONIC`, which Go's monotonic clock reads).
package perfsplit

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"maps"
	"os"
	"os/exec"
	"slices"
	"strconv"
	"strings"
	"syscall"
	"time"

	"golang.org/x/sys/unix"
)

// A Window is [From, To) in CLOCK_MONOTONIC nanoseconds; its samples go to
// Key.
type Window struct {
	From, To int64
	Key      int
}

// Stacks is a set of samples: each call chain, root first, its frames
// joined by ";" (as flame graph tools read them), and how many samples
// had it.
type Stacks map[string]int

// Samples is how many samples s holds.
func (s Stacks) Samples() int {
	n := 0
	for _, c := range s {
		n += c
	}
	return n
}

// Inclusive is, for each function, how many samples had it anywhere in
// their chain (once per sample, however often it recurs there).
func (s Stacks) Inclusive() map[string]int {
	out := map[string]int{}
	seen := map[string]bool{}
	for chain, c := range s {
		clear(seen)
		for fn := range strings.SplitSeq(chain, ";") {
			if !seen[fn] {
				seen[fn] = true
				out[fn] += c
			}
		}
	}
	return out
}

// Frames is a chain's frames, innermost first (as pprof orders a
// sample's locations).
func Frames(chain string) []string {
	f := strings.Split(chain, ";")
	slices.Reverse(f)
	return f
}

// Read sorts the samples of `perf script --ns -F tid,time,ip,sym` output of
// a recording with call chains among windows, which must not overlap.
// Samples outside every window are left out. A sample is a header line,
// "TID SECONDS.NANOS:", then a line per frame, innermost first,
// "ADDRESS SYMBOL", then an empty line; a frame perf could not name is
// "[unknown]".
func Read(r io.Reader, ws []Window) (map[int]Stacks, error) {
	ws = slices.Clone(ws)
	slices.SortFunc(ws, func(a, b Window) int { return int(a.From - b.From) })
	for i := 1; i < len(ws); i++ {
		if ws[i].From < ws[i-1].To {
			return nil, fmt.Errorf("windows overlap: [%d, %d) and [%d, %d)", ws[i-1].From, ws[i-1].To, ws[i].From, ws[i].To)
		}
	}
	out := map[int]Stacks{}
	for _, w := range ws {
		out[w.Key] = Stacks{}
	}
	var (
		frames []string
		at     int64
		in     bool // a sample's header read, its frames not yet ended
		line   int
	)
	flush := func() {
		if in && len(frames) > 0 {
			if w, ok := windowOf(ws, at); ok {
				slices.Reverse(frames)
				out[w.Key][strings.Join(frames, ";")]++
			}
		}
		frames, in = frames[:0], false
	}
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		line++
		text := sc.Text()
		trimmed := strings.TrimSpace(text)
		switch {
		case trimmed == "":
			flush()
		case text[0] == '\t':
			// A frame: "ADDRESS SYMBOL", the symbol possibly with spaces.
			_, sym, ok := strings.Cut(trimmed, " ")
			if !ok || !in {
				return nil, fmt.Errorf("perf script line %d: a frame outside a sample: %q", line, text)
			}
			frames = append(frames, strings.TrimSpace(sym))
		default:
			flush()
			t, err := headerTime(trimmed)
			if err != nil {
				return nil, fmt.Errorf("perf script line %d: %w", line, err)
			}
			at, in = t, true
		}
	}
	if err := sc.Err(); err != nil {
		return nil, err
	}
	flush()
	return out, nil
}

// headerTime reads a sample header's time, "TID SECONDS.NANOS:", in
// nanoseconds.
func headerTime(h string) (int64, error) {
	f := strings.Fields(h)
	if len(f) != 2 || !strings.HasSuffix(f[1], ":") {
		return 0, fmt.Errorf("not a sample header (TID SECONDS.NANOS:): %q", h)
	}
	sec, nanos, ok := strings.Cut(strings.TrimSuffix(f[1], ":"), ".")
	s, err1 := strconv.ParseInt(sec, 10, 64)
	n, err2 := strconv.ParseInt(nanos, 10, 64)
	if !ok || len(nanos) != 9 || err1 != nil || err2 != nil {
		return 0, fmt.Errorf("sample time %q: want seconds and 9 digits of nanoseconds (perf script --ns)", f[1])
	}
	return s*1e9 + n, nil
}

// windowOf is the window holding t, in ws sorted by From.
func windowOf(ws []Window, t int64) (Window, bool) {
	i, _ := slices.BinarySearchFunc(ws, t, func(w Window, t int64) int {
		switch {
		case w.To <= t:
			return -1
		case w.From > t:
			return 1
		}
		return 0
	})
	if i < len(ws) && ws[i].From <= t && t < ws[i].To {
		return ws[i], true
	}
	return Window{}, false
}

// MonoClock returns a func giving this process's instants (time.Time with
// their monotonic reading) in CLOCK_MONOTONIC nanoseconds, the clock of
// `perf record -k CLOCK_MONOTONIC`.
func MonoClock() (func(time.Time) int64, error) {
	var ts unix.Timespec
	now := time.Now()
	if err := unix.ClockGettime(unix.CLOCK_MONOTONIC, &ts); err != nil {
		return nil, fmt.Errorf("clock_gettime: %w", err)
	}
	ref := ts.Nano()
	return func(t time.Time) int64 { return ref + int64(t.Sub(now)) }, nil
}

// A Recording is `perf record` of some processes, under way.
type Recording struct {
	Path   string
	cmd    *exec.Cmd
	stderr bytes.Buffer
	// ctl and ack: perf's control and acknowledgement pipes, our ends,
	// open until Stop (closed at once, perf wrote an empty recording).
	ctl, ack *os.File
}

// Record starts sampling pids (every thread, those they start later too)
// hz times a second of their CPU, with call chains, into path. It returns
// once perf samples: perf starts with its events disabled (-D -1), and
// Record enables them through perf's control descriptor and waits for its
// acknowledgement (--control fd:…), up to attachTimeout. A fixed wait for
// perf to attach was too short on a loaded machine: a window before it
// went unsampled.
func Record(hz int, path string, pids ...int) (*Recording, error) {
	if len(pids) == 0 {
		return nil, errors.New("perf record: no process")
	}
	ps := make([]string, len(pids))
	for i, p := range pids {
		ps[i] = strconv.Itoa(p)
	}
	ctlR, ctlW, err := os.Pipe()
	if err != nil {
		return nil, err
	}
	ackR, ackW, err := os.Pipe()
	if err != nil {
		ctlR.Close()
		ctlW.Close()
		return nil, err
	}
	rec := &Recording{Path: path, ctl: ctlW, ack: ackR}
	// perf's fds 3 and 4: the control pipe's read end, the ack pipe's write end.
	rec.cmd = exec.Command("perf", "record", "-q", "-F", strconv.Itoa(hz), "-g", "-k", "CLOCK_MONOTONIC",
		"-D", "-1", "--control", "fd:3,4", "-p", strings.Join(ps, ","), "-o", path)
	rec.cmd.ExtraFiles = []*os.File{ctlR, ackW}
	rec.cmd.Stderr = &rec.stderr
	err = rec.cmd.Start()
	ctlR.Close()
	ackW.Close()
	if err != nil {
		rec.closePipes()
		return nil, fmt.Errorf("perf record (apt-get install linux-perf): %w", err)
	}
	if err := enable(ctlW, ackR); err != nil {
		_ = rec.cmd.Process.Kill()
		_ = rec.cmd.Wait()
		rec.closePipes()
		return nil, fmt.Errorf("perf record: %w: %s", err, strings.TrimSpace(rec.stderr.String()))
	}
	return rec, nil
}

// attachTimeout bounds how long Record waits for perf to acknowledge that
// its events are enabled.
const attachTimeout = 30 * time.Second

// enable asks perf to enable its events and waits for its "ack".
func enable(ctl io.Writer, ack *os.File) error {
	if _, err := io.WriteString(ctl, "enable\n"); err != nil {
		return fmt.Errorf("enable events: %w", err)
	}
	if err := ack.SetReadDeadline(time.Now().Add(attachTimeout)); err != nil {
		return err
	}
	buf := make([]byte, 4)
	if _, err := io.ReadFull(ack, buf); err != nil {
		return fmt.Errorf("no ack of enabled events: %w", err)
	}
	if string(buf) != "ack\n" {
		return fmt.Errorf("enable events: perf answered %q", buf)
	}
	return nil
}

func (r *Recording) closePipes() {
	r.ctl.Close()
	r.ack.Close()
}

// Stop ends the recording and waits for perf to write it out.
func (r *Recording) Stop() error {
	defer r.closePipes()
	if err := r.cmd.Process.Signal(syscall.SIGINT); err != nil {
		return fmt.Errorf("perf record: %w", err)
	}
	// perf writes its data out on SIGINT, then ends by it.
	if err := r.cmd.Wait(); err != nil && !endedBy(r.cmd, syscall.SIGINT) {
		return fmt.Errorf("perf record: %w: %s", err, strings.TrimSpace(r.stderr.String()))
	}
	if fi, err := os.Stat(r.Path); err != nil || fi.Size() == 0 {
		return fmt.Errorf("perf record wrote nothing to %s: %s", r.Path, strings.TrimSpace(r.stderr.String()))
	}
	return nil
}

func endedBy(cmd *exec.Cmd, sig syscall.Signal) bool {
	ws, ok := cmd.ProcessState.Sys().(syscall.WaitStatus)
	return ok && ws.Signaled() && ws.Signal() == sig
}

// Split reads the recording's samples and sorts them among windows (Read).
func (r *Recording) Split(ctx context.Context, ws []Window) (map[int]Stacks, error) {
	cmd := exec.CommandContext(ctx, "perf", "script", "-i", r.Path, "--ns", "-F", "tid,time,ip,sym")
	var stderr bytes.Buffer
	cmd.Stderr = &stderr
	out, err := cmd.StdoutPipe()
	if err != nil {
		return nil, err
	}
	if err := cmd.Start(); err != nil {
		return nil, fmt.Errorf("perf script: %w", err)
	}
	split, rerr := Read(out, ws)
	if rerr != nil {
		_, _ = io.Copy(io.Discard, out)
	}
	if err := cmd.Wait(); err != nil {
		return nil, fmt.Errorf("perf script: %w: %s", err, strings.TrimSpace(stderr.String()))
	}
	return split, rerr
}

// WriteFolded writes s as folded stacks ("root;…;leaf COUNT" a line, the
// input of flame graph tools), in a stable order.
func WriteFolded(path string, s Stacks) error {
	var b strings.Builder
	for _, chain := range slices.Sorted(maps.Keys(s)) {
		fmt.Fprintf(&b, "%s %d\n", chain, s[chain])
	}
	return os.WriteFile(path, []byte(b.String()), 0o644)
}

// A Growth is one function's CPU per unit of work (µs, inclusive) in two
// sets of samples.
type Growth struct {
	Func string
	A, B float64
}

// Grew lists the n functions whose inclusive CPU per unit of work grew
// most from a to b, most first. usA and usB are the µs of CPU one sample
// of a and of b stands for, per unit of work: the process's CPU over the
// windows ÷ their samples ÷ the work done in them.
func Grew(a, b Stacks, usA, usB float64, n int) []Growth {
	ia, ib := a.Inclusive(), b.Inclusive()
	var gs []Growth
	for fn := range ib {
		gs = append(gs, Growth{Func: fn, A: float64(ia[fn]) * usA, B: float64(ib[fn]) * usB})
	}
	for fn := range ia {
		if _, ok := ib[fn]; !ok {
			gs = append(gs, Growth{Func: fn, A: float64(ia[fn]) * usA})
		}
	}
	slices.SortFunc(gs, func(x, y Growth) int {
		if d := (y.B - y.A) - (x.B - x.A); d != 0 {
			if d > 0 {
				return 1
			}
			return -1
		}
		return strings.Compare(x.Func, y.Func)
	})
	return gs[:min(n, len(gs))]
}
