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
// consumers would reject; the one exception is AppendDecisionUnchecked, for
// the limiter, which builds its decision events valid by construction.
// Unknown members are ignored by decoders (see the
// versioning rules in schemas/README.md).
//
// The types, encoders, decoders and validation of the events are generated
// from the schemas (the *_gen.go files, by internal/eventgen; the exported
// functions of all events are in events_gen.go, one line each): to add or
// change a member, edit the schema and run `go generate ./pkg/events` (see
// schemas/README.md). The string grammars the schemas name with
// x-floodgate-format (ids, routes, resources, addresses, timestamps, text) are
// one hand-written function each in fields.go and time.go, and the JSON
// reading and writing primitives are in read.go and write.go. The generated
// code is append-based and hand-rolled like the code it replaced (no
// reflection): decoding a decision takes about a microsecond, twice as fast as
// encoding/json; see the benchmarks in this package.
package events

//go:generate go run ./internal/eventgen/cmd/eventgen -schemas ../../schemas -out .
