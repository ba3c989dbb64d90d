package events

import (
	"fmt"
	"strings"
)

// Event type names: the "type" member of every event, and the version in topic
// names.
const (
	TypeDecision   = "decision.v1"
	TypeAbuse      = "abuse.v1"
	TypeAdjustment = "adjustment.v1"
)

// PrincipalKind says what kind of caller a principal is.
type PrincipalKind string

// Principal kinds.
const (
	PrincipalUser      PrincipalKind = "user"
	PrincipalBot       PrincipalKind = "bot"
	PrincipalAPIKey    PrincipalKind = "api_key"
	PrincipalAnonymous PrincipalKind = "anonymous"
)

const principalKinds = "user|bot|api_key|anonymous"

// Valid reports whether k is one of the principal kinds.
func (k PrincipalKind) Valid() bool {
	_, ok := principalKind(k)
	return ok
}

func principalKind[S ~string | ~[]byte](s S) (PrincipalKind, bool) {
	switch string(s) {
	case "user":
		return PrincipalUser, true
	case "bot":
		return PrincipalBot, true
	case "api_key":
		return PrincipalAPIKey, true
	case "anonymous":
		return PrincipalAnonymous, true
	}
	return "", false
}

// Principal is who made a request: the unit that limits, quotas and penalties
// apply to.
type Principal struct {
	Kind PrincipalKind
	// ID is 1–128 bytes of UTF-8 without control characters.
	ID string
}

// Key returns "kind:id", the Kafka message key of every event about p, so that
// one principal's events stay in order on one partition.
func (p Principal) Key() string { return string(p.Kind) + ":" + p.ID }

// String returns p.Key().
func (p Principal) String() string { return p.Key() }

// ParsePrincipalKey parses a key made by Principal.Key and validates it.
func ParsePrincipalKey(key string) (Principal, error) {
	kind, id, ok := strings.Cut(key, ":")
	if !ok {
		return Principal{}, reason(fmt.Sprintf("%s is not a principal key kind:id", quote(key)))
	}
	k, ok := principalKind(kind)
	if !ok {
		return Principal{}, at("kind", oneOf(kind, principalKinds))
	}
	p := Principal{Kind: k, ID: id}
	if err := validPrincipalID(id); err != nil {
		return Principal{}, at("id", err)
	}
	return p, nil
}

// Validate checks p against the contract.
func (p Principal) Validate() error { return asError(p.validate()) }

func (p Principal) validate() *ValidationError {
	if !p.Kind.Valid() {
		return at("kind", oneOf(string(p.Kind), principalKinds))
	}
	if err := validPrincipalID(p.ID); err != nil {
		return at("id", err)
	}
	return nil
}

// Tier is the limit tier that decided a request.
type Tier string

// Tiers.
const (
	TierIP        Tier = "ip"
	TierPrincipal Tier = "principal"
	TierEndpoint  Tier = "endpoint"
	TierResource  Tier = "resource"
	TierQuota     Tier = "quota"
	TierPenalty   Tier = "penalty"
)

const tiers = "ip|principal|endpoint|resource|quota|penalty"

// Valid reports whether t is one of the tiers.
func (t Tier) Valid() bool {
	_, ok := tier(t)
	return ok
}

func tier[S ~string | ~[]byte](s S) (Tier, bool) {
	switch string(s) {
	case "ip":
		return TierIP, true
	case "principal":
		return TierPrincipal, true
	case "endpoint":
		return TierEndpoint, true
	case "resource":
		return TierResource, true
	case "quota":
		return TierQuota, true
	case "penalty":
		return TierPenalty, true
	}
	return "", false
}

// Pattern is the kind of abuse a detection found. New patterns are added to v1
// consumers-first (see schemas/README.md).
type Pattern string

// Patterns.
const (
	PatternRapidFire          Pattern = "rapid_fire"
	PatternDistributedIP      Pattern = "distributed_ip"
	PatternCredentialStuffing Pattern = "credential_stuffing"
	PatternScraping           Pattern = "scraping"
	PatternBotLike            Pattern = "bot_like" // inter-arrival times too regular for a person
)

const patterns = "rapid_fire|distributed_ip|credential_stuffing|scraping|bot_like"

// Valid reports whether p is one of the patterns.
func (p Pattern) Valid() bool { return oneOf(string(p), patterns) == nil }

// Severity grades a detection.
type Severity string

// Severities.
const (
	SeverityLow      Severity = "low"
	SeverityMedium   Severity = "medium"
	SeverityHigh     Severity = "high"
	SeverityCritical Severity = "critical"
)

const severities = "low|medium|high|critical"

// Valid reports whether s is one of the severities.
func (s Severity) Valid() bool { return oneOf(string(s), severities) == nil }

// PenaltyMode says whether a penalty was applied or only reported (shadow).
type PenaltyMode string

// Penalty modes.
const (
	PenaltySimulated PenaltyMode = "simulated"
	PenaltyEnforced  PenaltyMode = "enforced"
)

const penaltyModes = "simulated|enforced"

// Valid reports whether m is one of the penalty modes.
func (m PenaltyMode) Valid() bool { return oneOf(string(m), penaltyModes) == nil }

// ActorKind says who changed a limit scale.
type ActorKind string

// Actor kinds.
const (
	ActorLoop     ActorKind = "loop"
	ActorOperator ActorKind = "operator"
)

const actorKinds = "loop|operator"

// Valid reports whether k is one of the actor kinds.
func (k ActorKind) Valid() bool { return oneOf(string(k), actorKinds) == nil }
