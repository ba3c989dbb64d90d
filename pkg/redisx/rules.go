package redisx

import (
	"strconv"
	"strings"
	"time"
)

// Keys of rule rollouts (docs/rollouts.md).
//
//	fg:rules:impact:<topic>:<version>    hash of the decisions a rules version judged, by
//	                                     phase and priority: "shadow:critical:total",
//	                                     "shadow:critical:blocked", "enforced:bulk:total", …;
//	                                     every limiter replica adds its counts about once a
//	                                     second, the rollout controller reads them
//	fg:rules:impact:<topic>:<version>:t<unix>  the same counts for one RulesImpactSlot
//	                                     starting at <unix> seconds (the replica's flush
//	                                     time), kept RulesImpactSlotTTL: the controller's
//	                                     recent window sums the slots it covers
//	fg:rules:impact:<topic>:<version>:s<step>  the same counts since step <step> of a
//	                                     gradual rollout began (0: its shadow period), kept
//	                                     as long as the version's: a step is judged on its own
//	fg:cand:<version>:{<kind>:<id>}:…    a candidate version's buckets: the same keys as the
//	                                     enforced rules' under their own prefix (same hash
//	                                     tag, same slot), so a candidate in shadow never
//	                                     touches an enforced counter

// RulesImpactKey is the hash of the decisions rules version v of the rules
// topic judged.
func RulesImpactKey(topic string, v int64) string {
	return "fg:rules:impact:" + Escape(topic) + ":" + strconv.FormatInt(v, 10)
}

// RulesImpactSlot is the time slot of a version's windowed counts, and
// RulesImpactSlotTTL how long a slot is kept (the longest recent window a
// controller may judge is an hour).
const (
	RulesImpactSlot    = 10 * time.Second
	RulesImpactSlotTTL = 2 * time.Hour
)

// RulesImpactSlotKey is the hash of the decisions rules version v judged in
// the RulesImpactSlot that holds t.
func RulesImpactSlotKey(topic string, v int64, t time.Time) string {
	slot := t.Unix() - t.Unix()%int64(RulesImpactSlot/time.Second)
	return RulesImpactKey(topic, v) + ":t" + strconv.FormatInt(slot, 10)
}

// RulesImpactStepKey is the hash of the decisions rules version v judged
// since its step began (0: the shadow period).
func RulesImpactStepKey(topic string, v, step int64) string {
	return RulesImpactKey(topic, v) + ":s" + strconv.FormatInt(step, 10)
}

// CandidateKey is the key a candidate rules version v uses for key, an
// enforced bucket key ("fg:{kind:id}:tb:…"): same hash tag, its own prefix.
func CandidateKey(v int64, key string) string {
	return "fg:cand:" + strconv.FormatInt(v, 10) + ":" + strings.TrimPrefix(key, "fg:")
}
