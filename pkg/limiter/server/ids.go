package server

import (
	"encoding/binary"
	"encoding/hex"
	"math/rand/v2"
	"sync/atomic"
	"time"
)

// NewDecisionID mints a decision id: a UUIDv7 (RFC 9562), unique and
// time-ordered — 48 bits of Unix milliseconds, then 12 bits of the
// millisecond's fraction kept increasing across the process (method 3 of
// RFC 9562 §6.2, as github.com/google/uuid's NewV7), then 62 random bits.
// The random bits come from math/rand/v2 (the runtime's per-thread ChaCha8,
// seeded by the OS), not crypto/rand: a decision id identifies an event for
// deduplication and is no secret, and google/uuid's read of crypto/rand
// plus its String was a fifth of a decision event's CPU (docs/benchmarks.md).
// One allocation: the string.
func NewDecisionID() string {
	var s [DecisionIDLen]byte
	MintDecisionID(&s)
	return string(s[:])
}

// DecisionIDLen is a decision id's length: a UUID's 36 characters.
const DecisionIDLen = 36

// MintDecisionID writes a new decision id (NewDecisionID's) into s; no
// allocation.
func MintDecisionID(s *[DecisionIDLen]byte) {
	t := v7Time()
	var u [16]byte
	binary.BigEndian.PutUint64(u[0:], uint64(t>>12)<<16|0x7000|uint64(t&0xfff))
	binary.BigEndian.PutUint64(u[8:], rand.Uint64()&0x3fffffffffffffff|0x8000000000000000)
	hex.Encode(s[0:8], u[0:4])
	hex.Encode(s[9:13], u[4:6])
	hex.Encode(s[14:18], u[6:8])
	hex.Encode(s[19:23], u[8:10])
	hex.Encode(s[24:36], u[10:16])
	s[8], s[13], s[18], s[23] = '-', '-', '-', '-'
}

// lastV7 is the last id's time: Unix ms << 12 | the ms's fraction in 4096ths.
var lastV7 atomic.Int64

// v7Time is now as Unix ms << 12 | the ms's fraction in 4096ths, greater
// than every earlier one in the process (one more when the clock has not
// moved on, or went back). More than 4,096 ids in a millisecond move the
// time ahead of the clock until the clock catches up.
func v7Time() int64 {
	now := time.Now().UnixNano()
	t := now/1e6<<12 | (now%1e6)*4096/1e6
	for {
		last := lastV7.Load()
		next := max(t, last+1)
		if lastV7.CompareAndSwap(last, next) {
			return next
		}
	}
}
