package auditor

import (
	"net/netip"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Redaction says how a stored copy's value was redacted.
const (
	RedactedDecision = events.TypeDecision // decoded as decision.v1, IP truncated, re-encoded
	RedactedAbuse    = events.TypeAbuse    // decoded as abuse.v1, top IPs truncated, re-encoded
	RedactedScrubbed = "scrubbed"          // not a valid event: every IP literal in the bytes truncated
)

// TruncateIP cuts a to its network: an IPv4 address (or an IPv4-mapped IPv6
// one) to its /24, an IPv6 address to its /64. The zone is dropped. An invalid
// address is returned unchanged.
func TruncateIP(a netip.Addr) netip.Addr {
	if !a.IsValid() {
		return a
	}
	a = a.Unmap().WithZone("")
	bits := 24
	if a.Is6() {
		bits = 64
	}
	p, err := a.Prefix(bits)
	if err != nil {
		return a
	}
	return p.Addr()
}

// redacted is a value made safe to store.
type redacted struct {
	value     []byte
	how       string // RedactedDecision, RedactedAbuse or RedactedScrubbed
	eventType string // events.Type* when the value decoded
	eventID   string
}

// redactValue decodes v as a decision.v1 or abuse.v1 event and truncates every
// client IP in it (and IPs used as principal ids, as anonymous principals may
// be); anything else is scrubbed of IP literals byte-wise. v is not modified.
func redactValue(v []byte) redacted {
	if d, err := events.DecodeDecision(v); err == nil {
		d.IP = TruncateIP(d.IP)
		d.Principal.ID = scrubText(d.Principal.ID)
		if out, err := events.EncodeDecision(&d); err == nil {
			return redacted{value: out, how: RedactedDecision, eventType: events.TypeDecision, eventID: d.ID}
		}
	}
	if a, err := events.DecodeAbuse(v); err == nil {
		a.Principal.ID = scrubText(a.Principal.ID)
		for i := range a.Evidence.TopIPs {
			a.Evidence.TopIPs[i].IP = TruncateIP(a.Evidence.TopIPs[i].IP)
		}
		if out, err := events.EncodeAbuse(&a); err == nil {
			return redacted{value: out, how: RedactedAbuse, eventType: events.TypeAbuse, eventID: a.ID}
		}
	}
	return redacted{value: scrubBytes(v), how: RedactedScrubbed}
}

// scrubText truncates every IPv4 or IPv6 literal in s (see scrubBytes).
func scrubText(s string) string { return string(scrubBytes([]byte(s))) }

// scrubBytes returns a copy of b in which every run of characters that can
// form an IP address ([0-9A-Fa-f:.]) and parses as one is replaced by its
// truncated network address; a trailing '.' or ':' (end of a sentence) stays
// outside the address. A run that does not parse as a whole ("cafe1.2.3.4")
// still has the IPv4 dotted quads inside it truncated. Everything else is kept
// byte for byte, so the result is valid UTF-8 exactly when b is. It errs on
// the side of redaction: a version string like 1.2.3.4 is cut as well.
func scrubBytes(b []byte) []byte {
	return appendRuns(make([]byte, 0, len(b)), b, ipChar, ipChar, appendScrubbedRun)
}

// appendRuns appends b to out with every maximal run of it — a byte for
// which first holds, then bytes for which more holds — replaced by what run
// appends for it; the bytes between runs are kept.
func appendRuns(out, b []byte, first, more func(byte) bool, run func(out, r []byte) []byte) []byte {
	for i := 0; i < len(b); {
		if !first(b[i]) {
			out = append(out, b[i])
			i++
			continue
		}
		j := i + 1
		for j < len(b) && more(b[j]) {
			j++
		}
		out = run(out, b[i:j])
		i = j
	}
	return out
}

func appendScrubbedRun(out, run []byte) []byte {
	end := len(run)
	for end > 0 && (run[end-1] == '.' || run[end-1] == ':') && !(end >= 2 && run[end-2] == ':') {
		end--
	}
	if a, err := netip.ParseAddr(string(run[:end])); err == nil {
		out = append(out, TruncateIP(a).String()...)
		return append(out, run[end:]...)
	}
	// Look for dotted quads inside: maximal [0-9.] sub-runs.
	return appendRuns(out, run, isDigit, func(c byte) bool { return isDigit(c) || c == '.' }, appendScrubbedQuad)
}

// appendScrubbedQuad truncates sub when it is an IPv4 address (a trailing
// '.' stays outside it) and keeps it otherwise.
func appendScrubbedQuad(out, sub []byte) []byte {
	e := len(sub)
	for e > 0 && sub[e-1] == '.' {
		e--
	}
	if a, err := netip.ParseAddr(string(sub[:e])); err == nil && a.Is4() {
		out = append(out, TruncateIP(a).String()...)
		return append(out, sub[e:]...)
	}
	return append(out, sub...)
}

func isDigit(c byte) bool { return c >= '0' && c <= '9' }

func ipChar(c byte) bool {
	return isDigit(c) || c >= 'a' && c <= 'f' || c >= 'A' && c <= 'F' || c == ':' || c == '.'
}
