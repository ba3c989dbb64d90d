// Package series names the InfluxDB series one service writes and another
// reads, so the writer and its readers cannot drift apart.
package series

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
