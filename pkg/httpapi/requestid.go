package httpapi

import (
	"context"
	"encoding/binary"
	"encoding/hex"
	"log/slog"
	"math/rand/v2"
	"net/http"
	"sync/atomic"
	"time"
)

// HeaderRequestID is Floodgate's one correlation header: read (or minted) on
// the way in, echoed on every answer, logged as correlation_id, sent on every
// call to another service.
const HeaderRequestID = "X-Request-Id"

// KafkaHeaderRequestID is the Kafka record header a producer sets to the
// request id of the API call that caused the record: the dlq-auditor sets it
// on every record a replay writes back. Decision events do not carry it (one
// header fewer on the hot path); a decision is found by its ce_id, the
// decision id the check's answer carries (beside its correlation id).
const KafkaHeaderRequestID = "x-request-id"

// LogKey is the slog attribute that carries the correlation id.
const LogKey = "correlation_id"

type requestIDKey struct{}

// requestInfo is what Middleware keeps in a request's context: its id and,
// once Auth ran, its caller (for the access log). One value, one allocation.
type requestInfo struct {
	id     string
	caller Caller
}

// ValidRequestID reports whether id may be taken from a caller: 1-64 of
// [A-Za-z0-9._-]. Anything else is replaced by a minted id.
func ValidRequestID(id string) bool {
	if len(id) == 0 || len(id) > 64 {
		return false
	}
	for i := 0; i < len(id); i++ {
		c := id[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || c == '.' || c == '_' || c == '-') {
			return false
		}
	}
	return true
}

// NewRequestID mints a correlation id (MintID's UUIDv7: time-ordered).
func NewRequestID() string {
	var s [IDLen]byte
	MintID(&s)
	return string(s[:])
}

// IDLen is the length of a minted id: a UUID's 36 characters.
const IDLen = 36

// MintID writes a new id into s, without allocating: a UUIDv7 (RFC 9562),
// unique and time-ordered — 48 bits of Unix milliseconds, then 12 bits of
// the millisecond's fraction kept increasing across the process (method 3
// of RFC 9562 §6.2, as github.com/google/uuid's NewV7), then 62 random
// bits. The random bits come from math/rand/v2 (the runtime's per-thread
// ChaCha8, seeded by the OS), not crypto/rand: correlation and decision ids
// identify requests and events and are no secret, and google/uuid's read
// of crypto/rand plus its String was a fifth of a decision event's CPU
// (docs/benchmarks.md). Safe for concurrent use.
func MintID(s *[IDLen]byte) {
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

// WithRequestID returns ctx carrying id.
func WithRequestID(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, requestIDKey{}, id)
}

// RequestID is ctx's correlation id, or "".
func RequestID(ctx context.Context) string {
	switch v := ctx.Value(requestIDKey{}).(type) {
	case string:
		return v
	case *requestInfo:
		return v.id
	}
	return ""
}

// RequestIDFrom returns the caller's well-formed X-Request-Id or a new one.
func RequestIDFrom(r *http.Request) string {
	id, _ := requestIDFrom(r)
	return id
}

// requestIDFrom also reports whether the id was minted.
func requestIDFrom(r *http.Request) (string, bool) {
	if id := r.Header.Get(HeaderRequestID); ValidRequestID(id) {
		return id, false
	}
	return NewRequestID(), true
}

// RequestIDs puts the request id in the request's context and on the answer.
// Middleware includes it; use it alone where nothing else is wanted.
func RequestIDs(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id := RequestIDFrom(r)
		w.Header().Set(HeaderRequestID, id)
		next.ServeHTTP(w, r.WithContext(WithRequestID(r.Context(), id)))
	})
}

// LogHandler adds correlation_id to every record logged with a context that
// carries a request id (log.InfoContext(r.Context(), …)).
type LogHandler struct{ slog.Handler }

// Handle implements slog.Handler.
func (h LogHandler) Handle(ctx context.Context, rec slog.Record) error {
	if id := RequestID(ctx); id != "" {
		has := false
		rec.Attrs(func(a slog.Attr) bool {
			has = a.Key == LogKey
			return !has
		})
		if !has {
			rec.AddAttrs(slog.String(LogKey, id))
		}
	}
	return h.Handler.Handle(ctx, rec)
}

// WithAttrs implements slog.Handler.
func (h LogHandler) WithAttrs(attrs []slog.Attr) slog.Handler {
	return LogHandler{h.Handler.WithAttrs(attrs)}
}

// WithGroup implements slog.Handler.
func (h LogHandler) WithGroup(name string) slog.Handler { return LogHandler{h.Handler.WithGroup(name)} }
