package server

import (
	"encoding/json"
	"math"
	"strconv"
	"sync"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
)

// appendCheckResponse appends exactly what json.NewEncoder(w).Encode(checkResponse(id, corr, r))
// writes — same fields, same order, map keys sorted, trailing newline — without
// reflection or the headers map. The hot path of POST /v1/check uses it.
func appendCheckResponse(b []byte, id, corr string, r limiter.Result) []byte {
	b = append(b, '{')
	return append(appendCheckFields(b, id, corr, r), "}\n"...)
}

// batchAnswer is one check of a batch: its correlation id and decision, or the
// problem that kept it from being decided.
type batchAnswer struct {
	id      string // the decision's, minted here
	corr    string // the caller's correlation id
	res     limiter.Result
	invalid *httpapi.Problem
}

// appendBatchResponse appends exactly what json.NewEncoder(w).Encode of the
// BatchResponse of answers writes (BatchResult embeds *CheckResponse, so a
// decided check's fields follow its status in the same object).
func appendBatchResponse(b []byte, answers []batchAnswer) []byte {
	b = append(b, `{"results":[`...)
	for i, a := range answers {
		if i > 0 {
			b = append(b, ',')
		}
		if a.invalid != nil {
			b = append(b, `{"status":`...)
			b = strconv.AppendInt(b, int64(a.invalid.Status), 10)
			b = append(b, `,"error":`...)
			b = append(appendProblem(b, a.invalid), '}')
			continue
		}
		b = append(b, `{"status":200,`...)
		b = append(appendCheckFields(b, a.id, a.corr, a.res), '}')
	}
	return append(b, "]}\n"...)
}

// appendCheckFields appends CheckResponse's fields, without the braces.
func appendCheckFields(b []byte, id, corr string, r limiter.Result) []byte {
	b = append(b, `"id":`...)
	b = appendString(b, id)
	b = append(b, `,"allowed":`...)
	b = strconv.AppendBool(b, r.Allowed)
	b = append(b, `,"tier":`...)
	b = appendString(b, string(r.Tier))
	if r.Rule != "" {
		b = append(b, `,"rule":`...)
		b = appendString(b, r.Rule)
	}
	b = append(b, `,"limit":`...)
	b = strconv.AppendInt(b, int64(r.Limit), 10)
	b = append(b, `,"remaining":`...)
	b = strconv.AppendInt(b, int64(r.Remaining), 10)
	b = append(b, `,"reset_after_ms":`...)
	b = strconv.AppendInt(b, r.ResetAfter.Milliseconds(), 10)
	b = append(b, `,"retry_after_ms":`...)
	b = strconv.AppendInt(b, r.RetryAfter.Milliseconds(), 10)
	b = append(b, `,"penalty_multiplier":`...)
	b = appendFloat(b, r.Penalty)
	b = append(b, `,"scale":`...)
	b = appendFloat(b, r.Scale)
	if r.Shadow {
		b = append(b, `,"shadow":true`...)
	}
	if r.NearLimit {
		b = append(b, `,"near_limit":true`...)
	}
	if r.Degraded {
		b = append(b, `,"degraded":true`...)
	}
	b = append(b, `,"priority":`...)
	b = appendString(b, r.Priority.String())
	if r.Shed {
		b = append(b, `,"shed":true`...)
	}
	if r.Utilization != "" {
		b = append(b, `,"cluster_utilization_status":`...)
		b = appendString(b, r.Utilization)
	}
	b = append(b, `,"headers":`...)
	if r.Shed {
		b = appendShedHeaders(b, r, corr)
	} else {
		b = appendHeaders(b, r, corr)
	}
	if p := DenialProblem(r, corr); p != nil {
		b = append(b, `,"problem":`...)
		b = appendProblem(b, p)
	}
	return b
}

// appendShedHeaders writes Headers(r, id) of a shed answer.
func appendShedHeaders(b []byte, r limiter.Result, id string) []byte {
	b = append(b, `{"Retry-After":"`...)
	b = strconv.AppendInt(b, retryAfterSeconds(r), 10)
	b = append(b, `","X-Floodgate-Priority":`...)
	b = appendString(b, r.Priority.String())
	b = append(b, `,"X-Floodgate-Utilization":`...)
	b = appendString(b, r.Utilization)
	b = append(b, `,"X-Request-Id":`...)
	b = appendString(b, id)
	return append(b, '}')
}

// appendHeaders writes Headers(r, id) as a JSON object with its keys in
// encoding/json's (sorted) order.
func appendHeaders(b []byte, r limiter.Result, id string) []byte {
	period := r.Period
	if period <= 0 {
		period = time.Second
	}
	reset := ceilSeconds(r.ResetAfter)
	tier := string(r.Tier)
	name := policyName(r)
	b = append(b, `{"RateLimit":"\"`...)
	b = appendRaw(b, name)
	b = append(b, `\";r=`...)
	b = strconv.AppendInt(b, int64(r.Remaining), 10)
	b = append(b, ";t="...)
	b = strconv.AppendInt(b, rateLimitReset(r), 10)
	b = append(b, `","RateLimit-Policy":"\"`...)
	b = appendRaw(b, name)
	b = append(b, `\";q=`...)
	b = strconv.AppendInt(b, int64(policyQuota(r)), 10)
	b = append(b, ";w="...)
	b = strconv.AppendInt(b, ceilSeconds(period), 10)
	b = append(b, '"')
	if !r.Allowed {
		b = append(b, `,"Retry-After":"`...)
		b = strconv.AppendInt(b, retryAfterSeconds(r), 10)
		b = append(b, '"')
	}
	if r.Degraded && r.Error != limiter.ShedReason {
		b = append(b, `,"X-RateLimit-Error":`...)
		b = appendString(b, r.Error+"; answered by fail policy")
	}
	b = append(b, `,"X-RateLimit-Limit":"`...)
	b = strconv.AppendInt(b, int64(r.Limit), 10)
	b = append(b, `","X-RateLimit-Remaining":"`...)
	b = strconv.AppendInt(b, int64(r.Remaining), 10)
	b = append(b, `","X-RateLimit-Reset":"`...)
	b = strconv.AppendInt(b, reset, 10)
	b = append(b, `","X-RateLimit-Scope":`...)
	b = appendString(b, tier)
	if r.Degraded && r.Error == limiter.ShedReason {
		b = append(b, `,"X-RateLimit-Shed":"answered from local state"`...)
	}
	b = append(b, `,"X-Request-Id":`...)
	b = appendString(b, id)
	return append(b, '}')
}

func appendProblem(b []byte, p *httpapi.Problem) []byte {
	b = append(b, `{"type":`...)
	b = appendString(b, p.Type)
	b = append(b, `,"title":`...)
	b = appendString(b, p.Title)
	b = append(b, `,"status":`...)
	b = strconv.AppendInt(b, int64(p.Status), 10)
	if p.Detail != "" {
		b = append(b, `,"detail":`...)
		b = appendString(b, p.Detail)
	}
	if p.Instance != "" {
		b = append(b, `,"instance":`...)
		b = appendString(b, p.Instance)
	}
	if p.CorrelationID != "" { // httpapi.Problem's omitempty
		b = append(b, `,"correlation_id":`...)
		b = appendString(b, p.CorrelationID)
	}
	if len(p.ViolatedPolicies) > 0 {
		b = append(b, `,"violated-policies":[`...)
		for i, v := range p.ViolatedPolicies {
			if i > 0 {
				b = append(b, ',')
			}
			b = appendString(b, v)
		}
		b = append(b, ']')
	}
	if p.UtilizationStatus != "" {
		b = append(b, `,"cluster_utilization_status":`...)
		b = appendString(b, p.UtilizationStatus)
	}
	return append(b, '}')
}

// plainJSON reports whether s needs no escaping by encoding/json (HTML escaping included).
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c >= 0x80 || c == '"' || c == '\\' || c == '<' || c == '>' || c == '&' {
			return false
		}
	}
	return true
}

func appendString(b []byte, s string) []byte {
	if !plainJSON(s) { // rare: let encoding/json escape it exactly as it would
		q, _ := json.Marshal(s)
		return append(b, q...)
	}
	b = append(b, '"')
	b = append(b, s...)
	return append(b, '"')
}

// appendRaw appends s inside an open JSON string.
func appendRaw(b []byte, s string) []byte {
	if !plainJSON(s) {
		q, _ := json.Marshal(s)
		return append(b, q[1:len(q)-1]...)
	}
	return append(b, s...)
}

// appendFloat formats f as encoding/json does.
func appendFloat(b []byte, f float64) []byte {
	if math.IsInf(f, 0) || math.IsNaN(f) {
		return append(b, '0') // never produced: penalty and scale are finite, clamped
	}
	abs, format := math.Abs(f), byte('f')
	if abs != 0 && (abs < 1e-6 || abs >= 1e21) {
		format = 'e'
	}
	b = strconv.AppendFloat(b, f, format, -1, 64)
	if format == 'e' { // clean up e-09 to e-9, as encoding/json does
		if n := len(b); n >= 4 && b[n-4] == 'e' && b[n-3] == '-' && b[n-2] == '0' {
			b[n-2] = b[n-1]
			b = b[:n-1]
		}
	}
	return b
}

var respBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}
