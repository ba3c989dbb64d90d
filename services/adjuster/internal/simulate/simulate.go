// Package simulate replays a recorded signal series through candidate rules
// (open loop: the recorded signals do not react to the simulated scales) and
// renders the scale trajectory as a self-contained SVG or HTML page.
package simulate

import (
	"context"
	"encoding/csv"
	"errors"
	"fmt"
	"io"
	"maps"
	"slices"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/services/adjuster/internal/control"
)

// Row is one recorded sample; a signal whose reading is not OK was missing.
type Row struct {
	At      time.Time
	Signals control.Signals
}

// CSVHeader is the series file's header: ts is RFC 3339, the signals are
// fractions in [0, 1]; an empty cell means the signal was missing.
var CSVHeader = []string{"ts", "cpu", "mem", "error_rate", "abuse_rate"}

// ReadCSV reads a series file, refusing malformed rows with their line number.
func ReadCSV(r io.Reader) ([]Row, error) {
	cr := csv.NewReader(r)
	cr.FieldsPerRecord = len(CSVHeader)
	cr.Comment = '#'
	head, err := cr.Read()
	if err != nil {
		return nil, fmt.Errorf("read series header: %w", err)
	}
	if !slices.Equal(head, CSVHeader) {
		return nil, fmt.Errorf("series header %q: want %q", strings.Join(head, ","), strings.Join(CSVHeader, ","))
	}
	var rows []Row
	for {
		rec, err := cr.Read()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			return nil, fmt.Errorf("read series: %w", err)
		}
		line, _ := cr.FieldPos(0)
		at, err := time.Parse(time.RFC3339Nano, rec[0])
		if err != nil {
			return nil, fmt.Errorf("series line %d: ts %q: want RFC 3339", line, rec[0])
		}
		if len(rows) > 0 && !at.After(rows[len(rows)-1].At) {
			return nil, fmt.Errorf("series line %d: ts %s is not after the previous row", line, rec[0])
		}
		row := Row{At: at}
		readings := []*control.Reading{&row.Signals.CPU, &row.Signals.Mem, &row.Signals.ErrorRate, &row.Signals.AbuseRate}
		for i, dst := range readings {
			cell := strings.TrimSpace(rec[i+1])
			if cell == "" {
				continue
			}
			v, err := strconv.ParseFloat(cell, 64)
			if err != nil || v < 0 || v > 1 {
				return nil, fmt.Errorf("series line %d: %s %q: want a fraction in [0, 1]", line, CSVHeader[i+1], cell)
			}
			*dst = control.Reading{Value: v, At: at, OK: true}
		}
		rows = append(rows, row)
	}
	if len(rows) == 0 {
		return nil, errors.New("series has no rows")
	}
	return rows, nil
}

// WriteCSV writes rows in the series format (what --from-influx records with --save).
func WriteCSV(w io.Writer, rows []Row) error {
	cw := csv.NewWriter(w)
	if err := cw.Write(CSVHeader); err != nil {
		return err
	}
	for _, r := range rows {
		rec := []string{r.At.UTC().Format(time.RFC3339)}
		for _, name := range control.AllSignals {
			if rd := r.Signals.Get(name); rd.OK {
				rec = append(rec, strconv.FormatFloat(rd.Value, 'f', 4, 64))
			} else {
				rec = append(rec, "")
			}
		}
		if err := cw.Write(rec); err != nil {
			return err
		}
	}
	cw.Flush()
	return cw.Error()
}

// Source reads signals at a time (the loop's InfluxDB source satisfies it).
type Source interface {
	Read(ctx context.Context, now time.Time, window time.Duration) (control.Signals, error)
}

// FromSource records a series by reading src every step from start to stop
// over window, exactly as the loop would have read it then.
func FromSource(ctx context.Context, src Source, start, stop time.Time, step, window time.Duration) ([]Row, error) {
	if !stop.After(start) || step <= 0 {
		return nil, fmt.Errorf("record series: want start < stop and a positive step")
	}
	if n := stop.Sub(start) / step; n > 100000 {
		return nil, fmt.Errorf("record series: %d steps is too many; use a longer step", n)
	}
	var rows []Row
	for t := start; !t.After(stop); t = t.Add(step) {
		s, err := src.Read(ctx, t, window)
		if err != nil {
			return nil, fmt.Errorf("record series at %s: %w", t.Format(time.RFC3339), err)
		}
		rows = append(rows, Row{At: t, Signals: s})
	}
	return rows, nil
}

// Tick is the state after one simulated tick.
type Tick struct {
	At      time.Time
	Signals control.Signals
	Scales  map[string]float64
	Changes []control.Change
	Stale   []string
}

// Result is a whole replay.
type Result struct {
	Rules  control.Rules
	Ticks  []Tick
	Scopes []string
}

// Run replays rows through rules, ticking every rules.Tick from the first row
// to the last; each tick sees, per signal, the newest reading at or before it,
// so gaps in the series go stale exactly as they would live.
func Run(rules control.Rules, rows []Row, initial map[string]float64) (Result, error) {
	if err := rules.Validate(); err != nil {
		return Result{}, err
	}
	if len(rows) == 0 {
		return Result{}, errors.New("no rows to replay")
	}
	c := control.NewController(rules, initial)
	res := Result{Rules: rules, Scopes: slices.Sorted(maps.Keys(rules.Scopes))}
	var seen control.Signals
	i := 0
	end := rows[len(rows)-1].At
	for t := rows[0].At; !t.After(end); t = t.Add(rules.Tick.D()) {
		for ; i < len(rows) && !rows[i].At.After(t); i++ {
			for _, p := range []struct{ dst, src *control.Reading }{
				{&seen.CPU, &rows[i].Signals.CPU}, {&seen.Mem, &rows[i].Signals.Mem},
				{&seen.ErrorRate, &rows[i].Signals.ErrorRate}, {&seen.AbuseRate, &rows[i].Signals.AbuseRate},
			} {
				if p.src.OK {
					*p.dst = *p.src
				}
			}
			seen.AbusePerSec = rows[i].Signals.AbusePerSec
		}
		out := c.Step(control.Input{Now: t, Signals: seen})
		for _, ch := range out.Changes {
			c.Commit(t, ch)
		}
		res.Ticks = append(res.Ticks, Tick{At: t, Signals: seen, Scales: c.Scales(), Changes: out.Changes, Stale: out.Stale})
	}
	return res, nil
}

// Summary describes a replay in a few lines of text.
func (r Result) Summary() string {
	var b strings.Builder
	if len(r.Ticks) == 0 {
		return "no ticks\n"
	}
	first, last := r.Ticks[0], r.Ticks[len(r.Ticks)-1]
	fmt.Fprintf(&b, "replayed %d ticks of %s from %s to %s\n", len(r.Ticks), r.Rules.Tick,
		first.At.UTC().Format(time.RFC3339), last.At.UTC().Format(time.RFC3339))
	changes, stale := 0, 0
	for _, t := range r.Ticks {
		changes += len(t.Changes)
		if len(t.Stale) > 0 {
			stale++
		}
		for _, ch := range t.Changes {
			fmt.Fprintf(&b, "  %s  %-10s %6.4g -> %-6.4g %-16s %s\n", t.At.UTC().Format("2006-01-02T15:04:05Z"),
				ch.Scope, ch.Old, ch.New, ch.Rule, ch.Why)
		}
	}
	fmt.Fprintf(&b, "%d changes; %d ticks with a missing or stale signal\n", changes, stale)
	for _, s := range r.Scopes {
		lo := 10.0
		for _, t := range r.Ticks {
			lo = min(lo, t.Scales[s])
		}
		fmt.Fprintf(&b, "  %-10s final %.4g, lowest %.4g\n", s, last.Scales[s], lo)
	}
	return b.String()
}
