package events

import (
	"fmt"
	"strings"
)

// The event types, their members and enums are generated from the schemas
// (*_gen.go); this file adds what the schemas do not say.

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
	k, ok := enumValue(enumPrincipalKind, kind)
	if !ok {
		return Principal{}, at("kind", oneOf(kind, enumPrincipalKind.values()))
	}
	p := Principal{Kind: PrincipalKind(k), ID: id}
	if err := validPrincipalID(id); err != nil {
		return Principal{}, at("id", err)
	}
	return p, nil
}

// Validate checks p against the contract.
func (p Principal) Validate() error { return asError(p.validate()) }

// DefaultMaxCost is the largest cost one decision carries unless an operator
// says otherwise (issue 22 S3): the limiter's default max_cost of every rule
// and quota (the rules file's defaults.max_cost), and the bound the decision
// consumers put on an event's cost (FLOODGATE_EVENT_MAX_COST). The schema's
// own bound, 1,000,000, is the most either may be raised to.
const DefaultMaxCost = 10_000
