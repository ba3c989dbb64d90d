package config

import (
	"net"
	"net/netip"
)

// LoopbackOnly reports whether every listen address (host:port) is on
// loopback only — 127.0.0.0/8, ::1 or localhost; "off" listens nowhere.
// A service that would serve without credentials does so only then.
func LoopbackOnly(addrs ...string) bool {
	for _, a := range addrs {
		if a == "off" {
			continue
		}
		host, _, err := net.SplitHostPort(a)
		if err != nil {
			return false
		}
		if host == "localhost" {
			continue
		}
		ip, err := netip.ParseAddr(host)
		if err != nil || !ip.IsLoopback() {
			return false
		}
	}
	return true
}
