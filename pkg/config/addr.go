package config

import (
	"errors"
	"fmt"
	"io/fs"
	"net"
	"net/netip"
	"os"
	"strings"
	"syscall"
)

// LoopbackOnly reports whether every listen address (host:port) is on
// loopback only — 127.0.0.0/8, ::1 or localhost — or a unix socket, which
// only processes on the host that may open its file reach; "off" listens
// nowhere. A service that would serve without credentials does so only then.
func LoopbackOnly(addrs ...string) bool {
	for _, a := range addrs {
		if _, unix := UnixSocket(a); a == "off" || unix {
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

// UnixSocket is the path of a unix socket listen address — "unix:PATH", or
// gRPC's "unix://PATH" — and whether addr is one.
func UnixSocket(addr string) (string, bool) {
	path, ok := strings.CutPrefix(addr, "unix:")
	if !ok {
		return "", false
	}
	if p, ok := strings.CutPrefix(path, "//"); ok {
		path = p
	}
	return path, path != ""
}

// Listen listens on addr: a TCP host:port, or a unix socket (UnixSocket).
// A socket file no process listens on any more (one a killed process left)
// is removed first; a socket another process listens on, or a file that is
// not a socket, is an error. The socket file goes when the listener closes.
func Listen(addr string) (net.Listener, error) {
	path, unix := UnixSocket(addr)
	if !unix {
		return net.Listen("tcp", addr)
	}
	if fi, err := os.Lstat(path); err == nil {
		if fi.Mode().Type() != fs.ModeSocket {
			return nil, fmt.Errorf("listen %s: %s is not a socket", addr, path)
		}
		c, err := net.Dial("unix", path)
		if err == nil {
			_ = c.Close()
			return nil, fmt.Errorf("listen %s: another process listens on it", addr)
		}
		if !errors.Is(err, syscall.ECONNREFUSED) {
			return nil, fmt.Errorf("listen %s: %w", addr, err)
		}
		if err := os.Remove(path); err != nil {
			return nil, fmt.Errorf("listen %s: remove the socket left by a process that is gone: %w", addr, err)
		}
	}
	return net.Listen("unix", path)
}
