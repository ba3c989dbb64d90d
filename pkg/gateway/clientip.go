package gateway

import (
	"fmt"
	"net"
	"net/http"
	"net/netip"
	"strings"
)

// TrustedProxies is the set of networks whose X-Forwarded-For entries are believed.
type TrustedProxies []netip.Prefix

// ParseTrustedProxies parses CIDRs or bare addresses ("10.0.0.0/8,127.0.0.1").
func ParseTrustedProxies(list []string) (TrustedProxies, error) {
	var out TrustedProxies
	for _, s := range list {
		s = strings.TrimSpace(s)
		if s == "" {
			continue
		}
		if !strings.Contains(s, "/") {
			a, err := netip.ParseAddr(s)
			if err != nil {
				return nil, fmt.Errorf("trusted proxy %q: %w", s, err)
			}
			out = append(out, netip.PrefixFrom(a.Unmap(), a.Unmap().BitLen()))
			continue
		}
		p, err := netip.ParsePrefix(s)
		if err != nil {
			return nil, fmt.Errorf("trusted proxy %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

func (t TrustedProxies) contains(a netip.Addr) bool {
	a = a.Unmap()
	for _, p := range t {
		if p.Contains(a) {
			return true
		}
	}
	return false
}

// ClientIP returns the address of the client that made r. It starts from the TCP
// peer and walks X-Forwarded-For from the right, stepping over each hop only while
// the hop it came through is a trusted proxy. A client can prepend anything it
// likes to X-Forwarded-For; only entries appended by trusted proxies are believed,
// so a spoofed header cannot choose the IP a rate limit is counted against.
func ClientIP(r *http.Request, trusted TrustedProxies) (netip.Addr, error) {
	peer, err := peerAddr(r)
	if err != nil {
		return netip.Addr{}, err
	}
	if !trusted.contains(peer) {
		return peer, nil
	}
	var hops []string
	for _, h := range r.Header.Values("X-Forwarded-For") {
		hops = append(hops, strings.Split(h, ",")...)
	}
	client := peer
	for i := len(hops) - 1; i >= 0; i-- {
		a, err := netip.ParseAddr(strings.TrimSpace(hops[i]))
		if err != nil {
			break // garbage from an untrusted party: stop at the last address we trust
		}
		client = a.Unmap().WithZone("")
		if !trusted.contains(client) {
			break
		}
	}
	return client, nil //nolint:nilerr // an unparsable hop ends the walk; the last trusted address stands
}

// peerAddr is the TCP peer of r.
func peerAddr(r *http.Request) (netip.Addr, error) {
	host, _, err := net.SplitHostPort(r.RemoteAddr)
	if err != nil {
		host = r.RemoteAddr
	}
	peer, err := netip.ParseAddr(host)
	if err != nil {
		return netip.Addr{}, fmt.Errorf("remote address %q: %w", r.RemoteAddr, err)
	}
	return peer.Unmap().WithZone(""), nil
}
