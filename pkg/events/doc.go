// Package events holds Floodgate's event contracts — decision.v1, abuse.v1 and
// adjustment.v1 — as Go types with a validating JSON codec.
//
// The JSON Schemas in schemas/ at the repository root are the source of truth for
// producers in any language; this package enforces the same rules, and its
// conformance test proves that the two agree on a corpus of valid and mutated
// events. The only intended difference is that Go is stricter where JSON Schema
// cannot speak: principal ids are limited in UTF-8 bytes (the schema's maxLength
// counts characters), input must be I-JSON (valid UTF-8, no lone surrogates, no
// duplicate member names) and numbers must fit a 64-bit float.
//
// Decoding always validates: Decode* returns an error that satisfies
// errors.Is(err, ErrInvalid) for malformed JSON and for any contract violation,
// so a consumer can send such a message straight to its dead-letter topic.
// Encoding validates too, so a producer cannot publish an event that its own
// consumers would reject. Unknown members are ignored by decoders (see the
// versioning rules in schemas/README.md).
//
// The codec is hand-written (no reflection): decoding a decision takes a few
// hundred nanoseconds, several times faster than encoding/json; see the
// benchmarks in this package.
package events
