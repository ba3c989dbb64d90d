package events

// AppendDecisionUnchecked appends v's JSON encoding to dst as AppendDecision
// does, without validating v first. It is for the one producer that builds
// every member of its events from values already validated or made valid by
// construction — the limiter's decision events (pkg/limiter/server.Emit:
// the check's fields are vetted by the same validators when the check
// arrives, the rest the limiter computes within the contract) — where
// validation repeats those checks on every decision: about 0.4 µs, a third
// of the event's encoding (docs/benchmarks.md, issue 34). An event of any
// other origin goes through AppendDecision; consumers validate whatever
// they decode either way. It does not allocate when dst has room.
func AppendDecisionUnchecked(dst []byte, v *Decision) []byte { return v.appendJSON(dst) }

// ValidGateway reports whether s is a valid gateway name of an event: 1–64
// characters (MaxGatewayLen) of valid UTF-8 without control characters.
func ValidGateway(s string) error { return asError(validText(s, MaxGatewayLen, false)) }
