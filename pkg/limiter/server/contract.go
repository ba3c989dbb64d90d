package server

import (
	"math"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
)

// Headers is the exact set of response headers a gateway must send for a decision:
// the de-facto X-RateLimit-* family, the IETF RateLimit-Policy / RateLimit fields
// (draft-ietf-httpapi-ratelimit-headers), the deciding scope, a correlation id,
// on a denial Retry-After, and on a degraded answer X-RateLimit-Error.
//
// Retry-After is whole seconds rounded up and at least 1. For the daily quota it
// is never earlier than the quota's reset (00:00 UTC).
//
// A shed answer (Result.Shed) carries no limit fields — no limit decided it —
// but Retry-After, the priority it was shed at and the utilization status.
func Headers(r limiter.Result, correlationID string) map[string]string {
	if r.Shed {
		return map[string]string{
			"Retry-After":             strconv.FormatInt(retryAfterSeconds(r), 10),
			"X-Floodgate-Priority":    r.Priority.String(),
			"X-Floodgate-Utilization": r.Utilization,
			"X-Request-Id":            correlationID,
		}
	}
	period := r.Period
	if period <= 0 {
		period = time.Second
	}
	reset := ceilSeconds(r.ResetAfter)
	name := policyName(r)
	h := map[string]string{
		"X-RateLimit-Limit":     strconv.Itoa(r.Limit),
		"X-RateLimit-Remaining": strconv.Itoa(r.Remaining),
		"X-RateLimit-Reset":     strconv.FormatInt(reset, 10),
		"X-RateLimit-Scope":     string(r.Tier),
		"RateLimit-Policy":      `"` + name + `";q=` + strconv.Itoa(policyQuota(r)) + ";w=" + strconv.FormatInt(ceilSeconds(period), 10),
		"RateLimit":             `"` + name + `";r=` + strconv.Itoa(r.Remaining) + ";t=" + strconv.FormatInt(rateLimitReset(r), 10),
		"X-Request-Id":          correlationID,
	}
	if !r.Allowed {
		h["Retry-After"] = strconv.FormatInt(retryAfterSeconds(r), 10)
	}
	switch {
	case r.Degraded && r.Error == limiter.ShedReason:
		// Busy, not down: enforced from local state, so a gateway must not
		// treat it as the limiter's outage.
		h["X-RateLimit-Shed"] = "answered from local state"
	case r.Degraded:
		h["X-RateLimit-Error"] = r.Error + "; answered by fail policy"
	}
	return h
}

// policyName is the RateLimit-Policy the decision names: the deciding rule's
// id (stable across scale and penalty changes), or its tier without one.
func policyName(r limiter.Result) string {
	if r.Rule != "" {
		return r.Rule
	}
	return string(r.Tier)
}

// policyQuota is the policy's q: the rule's configured limit (rules file,
// overrides), not the scaled or penalized one — that is X-RateLimit-Limit.
func policyQuota(r limiter.Result) int {
	if r.Quota > 0 {
		return r.Quota
	}
	return r.Limit
}

// rateLimitReset is the RateLimit field's t: when the bucket is full again,
// or on a denial when a request fits again — never later than Retry-After,
// which is the same number then.
func rateLimitReset(r limiter.Result) int64 {
	if !r.Allowed {
		return retryAfterSeconds(r)
	}
	return ceilSeconds(r.ResetAfter)
}

func retryAfterSeconds(r limiter.Result) int64 {
	retry := r.RetryAfter
	if r.Tier == events.TierQuota {
		retry = max(retry, r.ResetAfter)
	}
	return max(ceilSeconds(retry), 1)
}

// DenialProblem is the body a gateway returns with the 429 — or, for a shed
// answer, with a 503: the platform, not the client, is short of capacity.
func DenialProblem(r limiter.Result, correlationID string) *httpapi.Problem {
	if r.Allowed {
		return nil
	}
	retry := strconv.FormatInt(retryAfterSeconds(r), 10)
	if r.Shed {
		return &httpapi.Problem{
			Type: httpapi.ProblemReducedCapacity, Title: "Service Unavailable", Status: 503,
			Detail:   "capacity is temporarily reduced: " + r.Priority.String() + " requests are shed; retry after " + retry + "s",
			Instance: "urn:floodgate:decision:" + correlationID, CorrelationID: correlationID, UtilizationStatus: r.Utilization,
		}
	}
	p := &httpapi.Problem{
		Type:             httpapi.ProblemRateLimited,
		Title:            "Too Many Requests",
		Status:           429,
		Detail:           "rate limit of the " + string(r.Tier) + " tier exceeded; retry after " + retry + "s",
		Instance:         "urn:floodgate:decision:" + correlationID,
		CorrelationID:    correlationID,
		ViolatedPolicies: []string{policyName(r)},
	}
	switch {
	case r.Tier == events.TierPenalty:
		p.Type = httpapi.ProblemPenalized
		p.Detail = "abnormal usage detected: limits for this client are temporarily reduced; retry after " + retry + "s"
	case r.Tier == events.TierQuota:
		p.Type = httpapi.ProblemQuota
		p.Detail = "daily quota exceeded; it resets at 00:00 UTC, in " + retry + "s"
	case r.Scale < 1:
		p.Type = httpapi.ProblemReducedCapacity
		p.Detail = "capacity is temporarily reduced to protect the service; retry after " + retry + "s"
	}
	return p
}

func ceilSeconds(d time.Duration) int64 {
	if d <= 0 {
		return 0
	}
	return int64(math.Ceil(d.Seconds()))
}
