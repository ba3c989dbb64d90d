package envoyrls

import (
	"sync"
	"time"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"github.com/floodgate-dev/floodgate/pkg/tick"
	"github.com/prometheus/client_golang/prometheus"
)

// unknownLogEvery bounds the log lines about calls for domains the envoy
// configuration does not have: a misrouted Envoy fleet sends thousands a
// second, and one line a minute (with how many it stands for) says it.
const unknownLogEvery = time.Minute

// unknownDomains answers, as envoy ratelimit does, a call for a domain its
// configuration does not have: every descriptor OK without a limit, nothing
// counted. It is counted in a metric and logged at most once a minute.
type unknownDomains struct {
	calls prometheus.Counter

	mu     sync.Mutex
	logged tick.Throttle
}

// envoyShaped reports whether a call is for an envoy ratelimit domain rather
// than in Floodgate's own descriptor shape: no descriptor names a principal
// with principal_kind or principal_id (docs/limiter.md). A call in
// Floodgate's shape keeps its mapping, its errors included, whatever its
// domain.
func envoyShaped(in *rlsv3.RateLimitRequest) bool {
	for _, d := range in.GetDescriptors() {
		for _, en := range d.GetEntries() {
			if k := en.GetKey(); k == KeyPrincipalKind || k == KeyPrincipalID {
				return false
			}
		}
	}
	return true
}

// answer is envoy ratelimit's answer to a call for a domain it has no
// configuration for: its configuration lookup finds no domain, so no
// descriptor has a limit — a descriptor's own `limit` override included,
// which it reads only for a known domain — and every status is OK with
// nothing remaining and no current limit.
func (u *unknownDomains) answer(e *EnvoyRLS, in *rlsv3.RateLimitRequest) *rlsv3.RateLimitResponse {
	u.calls.Inc()
	u.log(e, in.GetDomain())
	out := &rlsv3.RateLimitResponse{OverallCode: rlsv3.RateLimitResponse_OK,
		Statuses: make([]*rlsv3.RateLimitResponse_DescriptorStatus, len(in.GetDescriptors()))}
	for i := range out.Statuses {
		out.Statuses[i] = &rlsv3.RateLimitResponse_DescriptorStatus{Code: rlsv3.RateLimitResponse_OK}
	}
	e.countAnswer(false)
	return out
}

func (u *unknownDomains) log(e *EnvoyRLS, domain string) {
	u.mu.Lock()
	ok, n := u.logged.Pass(time.Now(), unknownLogEvery)
	u.mu.Unlock()
	if !ok {
		return
	}
	if len(domain) > 128 {
		domain = domain[:128]
	}
	e.s.Logger().Warn("envoy call for a domain the envoy ratelimit configuration does not have: answered OK without a limit, as envoy ratelimit does",
		"domain", domain, "more_since_last_line", n)
}
