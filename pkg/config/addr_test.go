package config

import "testing"

func TestLoopbackOnly(t *testing.T) {
	for addrs, want := range map[string]bool{
		"127.0.0.1:8085": true, "[::1]:8085": true, "localhost:1": true, "127.9.9.9:1": true, "off": true,
		"0.0.0.0:8085": false, ":8085": false, "10.0.0.1:80": false, "quota:8085": false, "nonsense": false,
	} {
		if got := LoopbackOnly(addrs); got != want {
			t.Errorf("LoopbackOnly(%q) = %v, want %v", addrs, got, want)
		}
	}
	if LoopbackOnly("127.0.0.1:1", "0.0.0.0:2") {
		t.Error("one address off loopback makes the set not loopback-only")
	}
}
