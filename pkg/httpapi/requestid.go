package httpapi

import (
	"context"
	"log/slog"
	"net/http"

	"github.com/google/uuid"
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

// NewRequestID mints a correlation id (a UUIDv7: time-ordered).
func NewRequestID() string {
	id, err := uuid.NewV7()
	if err != nil {
		return uuid.NewString()
	}
	return id.String()
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
