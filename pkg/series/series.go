// Package series names the InfluxDB series one service writes and another
// reads, so the writer and its readers cannot drift apart, and reads their
// values back (Number).
package series

import "strconv"

// The adjuster's series (services/adjuster/internal/effects, docs/adjuster.md):
// every tick writes one AdjusterScales point per managed scope — tags TagScope
// and TagDryRun ("true"/"false"), fields FieldScale (float) and FieldFrozen
// (bool) — and one AdjusterSignals point with a field per fresh signal and
// FieldShedLevel (integer, the priority shed level decided). The console's
// scale history reads AdjusterScales.
const (
	AdjusterScales  = "adjuster_scales"
	AdjusterSignals = "adjuster_signals"

	TagScope    = "scope"
	TagDryRun   = "dry_run"
	FieldScale  = "scale"
	FieldFrozen = "frozen"
	// FieldShedLevel is the shed level in AdjusterSignals.
	FieldShedLevel = "shed_level"
)

// Number is a value read back from InfluxDB — a Flux record's Value:
// float64, int64 or uint64, or a string holding a number — as a float64;
// ok is false for anything else.
func Number(v any) (n float64, ok bool) {
	switch x := v.(type) {
	case float64:
		return x, true
	case int64:
		return float64(x), true
	case uint64:
		return float64(x), true
	case string:
		f, err := strconv.ParseFloat(x, 64)
		return f, err == nil
	}
	return 0, false
}
