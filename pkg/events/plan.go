package events

import "regexp"

// planPattern is the grammar of a plan's name.
var planPattern = regexp.MustCompile(`^[a-z0-9][a-z0-9_-]{0,31}$`)

// ValidPlan reports whether s may name a plan ([a-z0-9][a-z0-9_-]{0,31}) — in
// a check, a rules file or an override, one grammar for all.
func ValidPlan(s string) bool { return planPattern.MatchString(s) }
