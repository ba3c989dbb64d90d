package httpapi

import (
	"context"
	"errors"
	"net"
	"net/http"
	"syscall"
)

// connKey holds a request's connection in its context (ServerConfig.NewServer
// sets ConnContext).
type connKey struct{}

// ConnContext is an http.Server's ConnContext that keeps the connection in
// each request's context, for CallerGone (ServerConfig.NewServer sets it).
func ConnContext(ctx context.Context, c net.Conn) context.Context {
	return context.WithValue(ctx, connKey{}, c)
}

// CallerGone reports whether the client of r has already closed its side of
// the connection — a caller that gave up on its deadline and failed open by
// itself, as an HTTP/1.1 client does — so that no answer can reach it. It
// peeks at the socket without consuming or waiting (recv MSG_PEEK |
// MSG_DONTWAIT): end of stream or a reset means gone; bytes or nothing yet
// mean the caller may still listen. Under overload a request can wait in
// the kernel's and the runtime's queues past its caller's deadline before
// it is read, which a relative timeout (X-Floodgate-Timeout-Ms), counted
// from the read, cannot see. False when the server was not made by
// ServerConfig.NewServer or the connection is not TCP.
func CallerGone(r *http.Request) bool {
	c, ok := r.Context().Value(connKey{}).(net.Conn)
	if !ok {
		return false
	}
	return connGone(c)
}

// connGone is CallerGone of the connection c.
func connGone(c net.Conn) bool {
	for {
		u, ok := c.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		c = u.Unwrap()
	}
	sc, ok := c.(syscall.Conn)
	if !ok {
		return false
	}
	raw, err := sc.SyscallConn()
	if err != nil {
		return false
	}
	gone := false
	// Control, not Read: it takes no read lock, so it never waits behind
	// net/http's background read of the same connection.
	_ = raw.Control(func(fd uintptr) {
		var b [1]byte
		n, _, err := syscall.Recvfrom(int(fd), b[:], syscall.MSG_PEEK|syscall.MSG_DONTWAIT)
		gone = (n == 0 && err == nil) || errors.Is(err, syscall.ECONNRESET)
	})
	return gone
}
