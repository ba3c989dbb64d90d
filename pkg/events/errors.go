package events

import (
	"errors"
	"strconv"
	"strings"
	"unicode/utf8"
)

// ErrInvalid is matched (with errors.Is) by every error that Decode*, Encode*,
// Append*, Validate and the field helpers return: malformed JSON as well as
// contract violations. A consumer treats such a message as poison.
var ErrInvalid = errors.New("invalid event")

// ValidationError says which event type and which field broke the contract, and
// how. It satisfies errors.Is(err, ErrInvalid).
type ValidationError struct {
	// Type is the event type being decoded, encoded or validated, e.g.
	// "decision.v1"; it is empty for errors from the field helpers (ValidRoute, …).
	Type string
	// Field is the path of the offending member, e.g. "principal.kind" or
	// "evidence.top_ips[2].ip"; it is empty when the document as a whole is wrong
	// (malformed JSON, not an object).
	Field string
	// Reason says what is wrong, quoting the offending value.
	Reason string
}

// Error returns "type: field: reason", leaving out the parts that are empty.
func (e *ValidationError) Error() string {
	var b strings.Builder
	b.Grow(len(e.Type) + len(e.Field) + len(e.Reason) + 4)
	for _, part := range [...]string{e.Type, e.Field, e.Reason} {
		if part == "" {
			continue
		}
		if b.Len() > 0 {
			b.WriteString(": ")
		}
		b.WriteString(part)
	}
	return b.String()
}

// Is reports whether target is ErrInvalid.
func (e *ValidationError) Is(target error) bool { return target == ErrInvalid }

// at prefixes field to e's field path and returns e.
func at(field string, e *ValidationError) *ValidationError {
	switch {
	case e.Field == "":
		e.Field = field
	case e.Field[0] == '[':
		e.Field = field + e.Field
	default:
		e.Field = field + "." + e.Field
	}
	return e
}

func reason(r string) *ValidationError { return &ValidationError{Reason: r} }

// asError converts a possibly nil *ValidationError to an error without the
// typed-nil trap.
func asError(e *ValidationError) error {
	if e == nil {
		return nil
	}
	return e
}

// withType sets the event type on e and returns it as an error (nil if e is nil).
func withType(typ string, e *ValidationError) error {
	if e == nil {
		return nil
	}
	e.Type = typ
	return e
}

// maxQuoted bounds how much of an offending value an error message repeats, so
// a 1 MB string does not become a 1 MB DLQ header.
const maxQuoted = 64

// quote returns s as a Go-quoted string, cut to maxQuoted bytes (on a rune
// boundary) with "…" after the closing quote when it was cut.
func quote(s string) string {
	if len(s) <= maxQuoted {
		return strconv.Quote(s)
	}
	cut := maxQuoted
	for cut > 0 && !utf8.RuneStart(s[cut]) {
		cut--
	}
	return strconv.Quote(s[:cut]) + "…"
}
