package tlstest

import (
	"net"
	"testing"
)

// Peer listens on a loopback port until the test ends and gives every
// connection to handle in a goroutine of its own (handle closes it); it
// returns the address. It stands in for a server a test scripts by hand: one
// that speaks TLS only, resets after the handshake, or never answers.
func Peer(t testing.TB, handle func(net.Conn)) string {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("tlstest: listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	go func() {
		for {
			c, err := ln.Accept()
			if err != nil {
				return
			}
			go handle(c)
		}
	}()
	return ln.Addr().String()
}
