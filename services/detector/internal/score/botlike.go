package score

// The bot_like pattern: inter-arrival regularity of a principal's requests.

import (
	"math"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// gap updates the exponentially weighted mean and variance of inter-arrival gaps.
func (s *Scorer) gap(p *pState, unixMs int64) {
	ms := uint32(unixMs - baseMs)
	if p.lastSec == 0 || int32(ms-p.lastMs) < 0 {
		if p.lastSec == 0 {
			p.lastMs = ms
		}
		return // first event, or a late one
	}
	g := float64(ms-p.lastMs) / 1000
	p.lastMs = ms
	if g > s.cfg.BotLikeMaxMeanGap.Seconds()*4 {
		p.gaps, p.gapMean, p.gapVar = 0, 0, 0 // a long pause starts a new session
		return
	}
	if p.gaps < math.MaxUint16 {
		p.gaps++
	}
	alpha := 1 / float64(min(p.gaps, 64))
	delta := g - float64(p.gapMean)
	mean := float64(p.gapMean) + alpha*delta
	p.gapMean = float32(mean)
	p.gapVar = float32((1 - alpha) * (float64(p.gapVar) + alpha*delta*delta))
}

// botLike fires for a user or anonymous principal whose request gaps are too
// regular for a person.
func (s *Scorer) botLike(d *events.Decision, ph uint64, p *pState, sec uint32) (*Detection, bool) {
	if d.Principal.Kind != events.PrincipalUser && d.Principal.Kind != events.PrincipalAnonymous {
		return nil, false
	}
	mean := float64(p.gapMean)
	if mean <= 0 || mean > s.cfg.BotLikeMaxMeanGap.Seconds() {
		return nil, false
	}
	cv := math.Sqrt(max(float64(p.gapVar), 0)) / mean
	near := int(p.gaps) >= s.cfg.BotLikeMinGaps/2 && cv < 2*s.cfg.BotLikeMaxCV
	if int(p.gaps) < s.cfg.BotLikeMinGaps || cv >= s.cfg.BotLikeMaxCV || sec < p.cool[pBotLike] {
		return nil, near
	}
	if d.Principal.Kind == events.PrincipalAnonymous && s.ips.principals(ipKeyOnly(d.IP), sec) >= int64(s.cfg.SharedIPPrincipals) {
		return nil, near
	}
	p.cool[pBotLike] = sec + s.coolSec
	span := time.Duration(mean * float64(p.gaps) * float64(time.Second))
	return &Detection{
		Pattern: BotLike, Principal: d.Principal, At: d.TS, FirstEventAt: d.TS.Add(-span),
		WindowStart: d.TS.Add(-span).Truncate(time.Second), Window: max(span.Truncate(time.Second), time.Second),
		Score: min(s.cfg.BotLikeMaxCV/max(cv, 1e-3), 100), Threshold: 1, ObservedRate: 1 / mean,
		Count: int64(p.gaps) + 1, Route: d.Route, GapMean: mean, GapCV: cv,
		// Regular timing is a signal, not harm: a script polling far inside
		// its limits hurts nobody. Reported for review, never penalized or paged.
		Severity: events.SeverityLow, Penalize: false,
	}, true
}
