// Package rollout is the rules topic of the limiter's rule rollouts
// (docs/rollouts.md): rules versions on the compacted topic floodgate.rules.v1
// (schemas/rules.v1.json), the state every reader rebuilds from it, the
// operations that append to it (propose, promote, roll back), the live impact
// the limiter replicas count in Redis, and the controller that promotes a
// candidate or rolls it back on that impact.
//
// The topic is one partition keyed by version: compaction keeps each
// version's latest record, and the state is a pure function of the records in
// offset order, so every limiter replica, the controller, the console and the
// command line agree on what is enforced and what is in shadow.
package rollout

import (
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Defaults of a rollout's parameters when its record leaves them out.
const (
	DefaultMaxCriticalBlockShare = 0.05
	DefaultMinCritical           = 20
)

// Entry is one record of the rules topic and where it is.
type Entry struct {
	Offset int64
	events.RulesVersion
}

// MaxShare is the share of CRITICAL decisions the version may block.
func (e Entry) MaxShare() float64 {
	if e.MaxCriticalBlockShare > 0 {
		return e.MaxCriticalBlockShare
	}
	return DefaultMaxCriticalBlockShare
}

// MinSamples is how many CRITICAL decisions must be judged before the share
// decides anything.
func (e Entry) MinSamples() int64 {
	if e.MinCritical > 0 {
		return e.MinCritical
	}
	return DefaultMinCritical
}

// ShadowFor is the shadow period (0: none recorded).
func (e Entry) ShadowFor() time.Duration { return time.Duration(e.ShadowForMs) * time.Millisecond }

// WatchFor is the watch after promotion (0: nothing watched).
func (e Entry) WatchFor() time.Duration { return time.Duration(e.WatchForMs) * time.Millisecond }

// State is what the rules topic says, rebuilt from its records in offset
// order. The zero value is an empty topic. Not safe for concurrent use; Clone
// it to hand it on.
type State struct {
	latest map[int64]Entry // each version's latest record
	next   int64           // the offset after the last record applied
}

// Apply adds the record at offset. Records must come in offset order.
func (s *State) Apply(offset int64, rec events.RulesVersion) {
	if s.latest == nil {
		s.latest = map[int64]Entry{}
	}
	s.latest[rec.Version] = Entry{Offset: offset, RulesVersion: rec}
	s.next = offset + 1
}

// Next is the offset after the last record applied (0 for none).
func (s *State) Next() int64 { return s.next }

// Clone returns a copy that later Applies to s do not change.
func (s *State) Clone() State {
	c := State{latest: make(map[int64]Entry, len(s.latest)), next: s.next}
	for k, v := range s.latest {
		c.latest[k] = v
	}
	return c
}

// Enforced is the rules in force: the latest record whose state is enforced.
func (s *State) Enforced() (Entry, bool) {
	var best Entry
	ok := false
	for _, e := range s.latest {
		if e.State == events.RulesStateEnforced && (!ok || e.Offset > best.Offset) {
			best, ok = e, true
		}
	}
	return best, ok
}

// Candidate is the rollout in shadow: the latest record in state shadow
// published after the enforced one.
func (s *State) Candidate() (Entry, bool) {
	enf, hasEnf := s.Enforced()
	var best Entry
	ok := false
	for _, e := range s.latest {
		if e.State != events.RulesStateShadow || (hasEnf && e.Offset < enf.Offset) {
			continue
		}
		if !ok || e.Offset > best.Offset {
			best, ok = e, true
		}
	}
	return best, ok
}

// Version returns the latest record of version v.
func (s *State) Version(v int64) (Entry, bool) {
	e, ok := s.latest[v]
	return e, ok
}

// Versions returns each version's latest record, newest version first.
func (s *State) Versions() []Entry {
	out := make([]Entry, 0, len(s.latest))
	for _, e := range s.latest {
		out = append(out, e)
	}
	slices.SortFunc(out, func(a, b Entry) int { return int(b.Version - a.Version) })
	return out
}

// NextVersion is the number a new version gets.
func (s *State) NextVersion() int64 {
	var hi int64
	for v := range s.latest {
		hi = max(hi, v)
	}
	return hi + 1
}

// Errors the operations return for a state that does not allow them.
var (
	ErrInProgress    = errors.New("a rollout is already in shadow; promote, abort or wait for it first")
	ErrNoEnforced    = errors.New("the rules topic has no enforced version yet; publish the first one with -bootstrap")
	ErrHasEnforced   = errors.New("the rules topic already has an enforced version; a bootstrap is only for the first")
	ErrNothingToUndo = errors.New("nothing to roll back: no candidate in shadow and the enforced version has no parent")
	ErrNoCandidate   = errors.New("no candidate in shadow")
)

// ValidTopic checks a Kafka topic name: 1-249 characters of [a-zA-Z0-9._-].
func ValidTopic(name string) error {
	if len(name) == 0 || len(name) > 249 || name == "." || name == ".." {
		return fmt.Errorf("%q: a topic name of 1 to 249 characters is required", name)
	}
	for _, c := range name {
		if !(c >= 'a' && c <= 'z' || c >= 'A' && c <= 'Z' || c >= '0' && c <= '9' || c == '.' || c == '_' || c == '-') {
			return fmt.Errorf("%q: a topic name has only [a-zA-Z0-9._-]", name)
		}
	}
	return nil
}
