package server

import "github.com/floodgate-dev/floodgate/pkg/httpapi"

// NewDecisionID mints a decision id: a UUIDv7 (RFC 9562), unique and
// time-ordered, minted as correlation ids are (httpapi.MintID, which says
// why its random bits are math/rand/v2's). One allocation: the string.
func NewDecisionID() string {
	var s [DecisionIDLen]byte
	MintDecisionID(&s)
	return string(s[:])
}

// DecisionIDLen is a decision id's length: a UUID's 36 characters.
const DecisionIDLen = httpapi.IDLen

// MintDecisionID writes a new decision id (NewDecisionID's) into s; no
// allocation. It is httpapi.MintID: request and decision ids are minted alike.
func MintDecisionID(s *[DecisionIDLen]byte) { httpapi.MintID(s) }
