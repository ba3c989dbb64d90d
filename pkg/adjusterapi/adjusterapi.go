// Package adjusterapi holds the JSON documents of the adjuster's admin API
// (docs/adjuster.md) that the adjuster writes and the console reads: GET
// /v1/status and the settings audit. One definition serves both, so a field the
// adjuster adds or renames is what the console decodes.
package adjusterapi

import (
	"encoding/json"
	"fmt"
	"time"
)

// Status is GET /v1/status: what the last tick saw and did.
type Status struct {
	At       time.Time           `json:"at"`
	Version  int64               `json:"settings_version"`
	DryRun   bool                `json:"dry_run"`
	Frozen   bool                `json:"frozen"`
	Scales   map[string]float64  `json:"scales"`
	Signals  map[string]*float64 `json:"signals"`
	Stale    []string            `json:"stale"`
	Engaged  map[string][]string `json:"engaged"`
	Held     map[string]string   `json:"held"`
	Changes  []Change            `json:"changes"`
	Override map[string]float64  `json:"overrides"`
	// Shed is the shed level decided (applied unless in a dry run) and why.
	Shed    ShedStep `json:"shed"`
	Errors  []string `json:"errors,omitempty"`
	Pending int      `json:"pending_events"`
}

// Change is one scale change of a tick, with its cause.
type Change struct {
	Scope string  `json:"scope"`
	Old   float64 `json:"old"`
	New   float64 `json:"new"`
	Rule  string  `json:"rule"`
	// Why explains the decision in words, e.g. "cpu 0.91 > 0.85".
	Why string `json:"why"`
}

// ShedStep is one tick's priority shed decision.
type ShedStep struct {
	Level int    `json:"level"` // after the step
	Old   int    `json:"old"`
	Why   string `json:"why,omitempty"`  // why the level is what it is
	Held  string `json:"held,omitempty"` // why a lower level was not taken
	// Unknown names the shed signals that were missing or stale: they
	// neither raise nor hold a level.
	Unknown []string `json:"unknown,omitempty"`
	// Signals are the known shed signals' values over the shed window.
	Signals map[string]float64 `json:"signals,omitempty"`
	// StepDownAt is when the level steps down next and ZeroAt when it
	// reaches 0, if the known signals stay below their release lines; absent
	// at level 0 and while a signal above its release line holds the level.
	StepDownAt *time.Time `json:"step_down_at,omitempty"`
	ZeroAt     *time.Time `json:"zero_at,omitempty"`
	// At is when the step was decided.
	At time.Time `json:"at,omitzero"`
}

// Changed reports whether the step moved the level.
func (s ShedStep) Changed() bool { return s.Level != s.Old }

// ShedNames says what each shed level refuses.
var ShedNames = [...]string{"nothing shed", "bulk shed", "bulk and best_effort shed", "everything but critical shed"}

// Sheds is the level in words.
func (s ShedStep) Sheds() string {
	if s.Level >= 0 && s.Level < len(ShedNames) {
		return ShedNames[s.Level]
	}
	return fmt.Sprintf("level %d", s.Level)
}

// AuditRecord is who changed the adjuster's settings, when and why
// (GET /v1/audit).
type AuditRecord struct {
	ID            string    `json:"id"`
	At            time.Time `json:"at"`
	Actor         string    `json:"actor"`
	Role          string    `json:"role"`
	Action        string    `json:"action"`
	Reason        string    `json:"reason"`
	CorrelationID string    `json:"correlation_id"`
	VersionBefore int64     `json:"version_before"`
	VersionAfter  int64     `json:"version_after"`
	// Before and After are the settings documents as JSON.
	Before json.RawMessage `json:"before"`
	After  json.RawMessage `json:"after"`
}
