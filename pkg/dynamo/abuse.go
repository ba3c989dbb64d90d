package dynamo

// Verdict attributes of a floodgate_abuse_records item: a trust-and-safety
// reviewer's latest verdict on the detection (verdict.v1, written by the
// console; docs/console.md). The detector never writes them; an item without
// AttrVerdict has not been judged.
const (
	AttrVerdict           = "verdict"             // confirmed | false_positive | unsure
	AttrVerdictID         = "verdict_id"          // the verdict.v1 event id
	AttrVerdictAt         = "verdict_at"          // RFC 3339, when it was given
	AttrVerdictBy         = "verdict_by"          // the reviewer (console account or token)
	AttrVerdictReason     = "verdict_reason"      // the reviewer's reason
	AttrVerdictRoute      = "verdict_route"       // the detection's top route template, for precision by route
	AttrVerdictNetwork    = "verdict_network"     // its network class (pkg/precision), for precision by network
	AttrVerdictAllowUntil = "verdict_allow_until" // a false positive's allowlist expiry, RFC 3339
	AttrVerdictLifted     = "verdict_lifted"      // BOOL: a false positive found a live penalty and lifted it
)
