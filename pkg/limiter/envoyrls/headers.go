package envoyrls

import (
	"math"
	"strconv"
	"time"

	corev3 "github.com/envoyproxy/go-control-plane/envoy/config/core/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"

	"github.com/floodgate-dev/floodgate/pkg/envoyconf"
)

// EnvoyHeaders names the response headers envoy ratelimit adds with
// LIMIT_RESPONSE_HEADERS_ENABLED (its LIMIT_LIMIT_HEADER,
// LIMIT_REMAINING_HEADER, LIMIT_RESET_HEADER): the limit, the remaining
// count and the seconds until the window resets of the descriptor closest
// to its limit — the last one over its limit, else the one with the fewest
// remaining (the first of equals).
type EnvoyHeaders struct {
	Limit, Remaining, Reset string
	Clock                   func() time.Time // nil: time.Now
}

// DefaultEnvoyHeaders are envoy ratelimit's default header names.
func DefaultEnvoyHeaders() *EnvoyHeaders {
	return &EnvoyHeaders{Limit: "RateLimit-Limit", Remaining: "RateLimit-Remaining", Reset: "RateLimit-Reset"}
}

// add puts the headers of the descriptor closest to its limit on out, as
// envoy ratelimit does: among statuses with a current limit the smallest
// remaining wins, an over-limit status always does; none without a limit.
func (h *EnvoyHeaders) add(out *rlsv3.RateLimitResponse) {
	var pick *rlsv3.RateLimitResponse_DescriptorStatus
	least := uint32(math.MaxUint32)
	for _, st := range out.GetStatuses() {
		if st.GetCurrentLimit() != nil && st.GetLimitRemaining() < least {
			pick, least = st, st.GetLimitRemaining()
		}
		if st.GetCode() == rlsv3.RateLimitResponse_OVER_LIMIT {
			pick, least = st, 0
		}
	}
	if pick == nil || pick.GetCurrentLimit() == nil {
		return
	}
	now := time.Now
	if h.Clock != nil {
		now = h.Clock
	}
	secs := envoyconf.Unit(pick.GetCurrentLimit().GetUnit()).Seconds()
	reset := int64(0)
	if secs > 0 {
		reset = secs - now().Unix()%secs
	}
	out.ResponseHeadersToAdd = append(out.ResponseHeadersToAdd,
		&corev3.HeaderValue{Key: h.Limit, Value: strconv.FormatUint(uint64(pick.GetCurrentLimit().GetRequestsPerUnit()), 10)},
		&corev3.HeaderValue{Key: h.Remaining, Value: strconv.FormatUint(uint64(pick.GetLimitRemaining()), 10)},
		&corev3.HeaderValue{Key: h.Reset, Value: strconv.FormatInt(reset, 10)})
}
