package deferred

import (
	"crypto/hmac"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"time"
)

// Headers of a replayed request. The worker authenticates as itself (its
// service token in Authorization); the principal the request was made by
// travels in HeaderPrincipal, signed in HeaderSignature:
//
//	X-Floodgate-Principal: <kind>:<id>
//	X-Floodgate-Signature: t=<unix seconds>,v1=<hex HMAC-SHA256>
//
// over "<t>\n<Idempotency-Key>\n<principal>\n<METHOD>\n<path>" with the
// shared signing key (FLOODGATE_DEFERRED_SIGNING_KEY). An upstream checks it
// with VerifyPrincipal before it believes the principal.
const (
	HeaderPrincipal   = "X-Floodgate-Principal"
	HeaderSignature   = "X-Floodgate-Signature"
	HeaderDeadline    = "X-Floodgate-Deadline" // RFC 3339 ms: the upstream must not start the work after it
	HeaderIdempotency = "Idempotency-Key"
)

// Sign returns the HeaderSignature value of a replay.
func Sign(key []byte, at time.Time, id, principal, method, path string) string {
	t := strconv.FormatInt(at.Unix(), 10)
	return "t=" + t + ",v1=" + mac(key, t, id, principal, method, path)
}

func mac(key []byte, t, id, principal, method, path string) string {
	m := hmac.New(sha256.New, key)
	m.Write([]byte(t + "\n" + id + "\n" + principal + "\n" + method + "\n" + path))
	return hex.EncodeToString(m.Sum(nil))
}

// ErrBadSignature is wrapped by VerifyPrincipal's errors.
var ErrBadSignature = errors.New("deferred: bad principal signature")

// VerifyPrincipal checks a replayed request's signed principal and returns it
// ("kind:id"): the signature must match key and be at most skew old (or
// ahead). Upstreams in Go call it; others follow the recipe above.
func VerifyPrincipal(r *http.Request, key []byte, now time.Time, skew time.Duration) (string, error) {
	p := r.Header.Get(HeaderPrincipal)
	sig := r.Header.Get(HeaderSignature)
	t, v1, ok := strings.Cut(sig, ",")
	t, okT := strings.CutPrefix(t, "t=")
	v1, okV := strings.CutPrefix(v1, "v1=")
	if p == "" || !ok || !okT || !okV {
		return "", fmt.Errorf("%w: missing %s or %s", ErrBadSignature, HeaderPrincipal, HeaderSignature)
	}
	sec, err := strconv.ParseInt(t, 10, 64)
	if err != nil {
		return "", fmt.Errorf("%w: t=%q", ErrBadSignature, t)
	}
	if d := now.Sub(time.Unix(sec, 0)); d > skew || d < -skew {
		return "", fmt.Errorf("%w: signed %s ago, outside ±%s", ErrBadSignature, d.Round(time.Second), skew)
	}
	want := mac(key, t, r.Header.Get(HeaderIdempotency), p, r.Method, r.URL.EscapedPath())
	if !hmac.Equal([]byte(want), []byte(v1)) {
		return "", fmt.Errorf("%w: mismatch", ErrBadSignature)
	}
	return p, nil
}
