package redisx

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"
)

// A dialFunc opens one connection, as go-redis's Options.Dialer does.
type dialFunc = func(ctx context.Context, network, addr string) (net.Conn, error)

// handshakeAhead returns dial with the connection handshake moved into the
// dial. go-redis initialises a connection on its first command, not when it
// dials it: a connection the pool dialed ahead (MinIdleConns) sends HELLO and
// waits for the reply before the command that took it, so behind a 40 ms link
// that command took two round trips and ran past a check's 50 ms budget
// (chaos redis-slow, docs/chaos.md). Here the dial sends the same HELLO and
// reads its reply, off the request path when the pool dials ahead; when
// go-redis then writes that HELLO, the write is absorbed and the reply already
// read is handed back, with no round trip.
//
// hello must be the exact command go-redis sends first (helloCommand). When
// the first write is anything else — another go-redis version, other
// credentials — the reply read ahead is dropped and the connection behaves as
// if this wrapper were not there: HELLO is safe to send twice. A connection
// whose HELLO gets no reply within timeout (or ctx) is closed and the dial
// fails, as the handshake would have.
func handshakeAhead(dial dialFunc, hello []byte, timeout time.Duration) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := dial(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		deadline := time.Now().Add(timeout)
		if d, ok := ctx.Deadline(); ok && d.Before(deadline) {
			deadline = d
		}
		reply, rest, err := exchange(c, hello, deadline)
		if err != nil {
			_ = c.Close()
			return nil, fmt.Errorf("redisx: HELLO on a new connection to %s: %w", addr, err)
		}
		return withSyscall(&readyConn{Conn: c, hello: hello, reply: reply, rest: rest}, c), nil
	}
}

// exchange writes cmd on c and reads one whole reply before deadline; rest is
// whatever arrived after the reply.
func exchange(c net.Conn, cmd []byte, deadline time.Time) (reply, rest []byte, err error) {
	if err := c.SetDeadline(deadline); err != nil {
		return nil, nil, err
	}
	if _, err := c.Write(cmd); err != nil {
		return nil, nil, err
	}
	br := bufio.NewReader(c)
	var out bytes.Buffer
	if err := copyReply(&out, br); err != nil {
		return nil, nil, err
	}
	if err := c.SetDeadline(time.Time{}); err != nil {
		return nil, nil, err
	}
	rest, _ = br.Peek(br.Buffered())
	return out.Bytes(), bytes.Clone(rest), nil
}

// helloCommand is the HELLO go-redis v9 writes first on every connection it
// initialises (baseClient.initConn → Hello): protocol, AUTH when a password
// is set (user "default" when none is named), no SETNAME since no client
// name is set — as a RESP array of bulk strings, the way go-redis's writer
// encodes it.
func helloCommand(protocol int, username, password string) []byte {
	args := []string{"hello", strconv.Itoa(protocol)}
	if password != "" {
		if username == "" {
			username = "default"
		}
		args = append(args, "auth", username, password)
	}
	b := []byte("*" + strconv.Itoa(len(args)) + "\r\n")
	for _, a := range args {
		b = append(b, '$')
		b = strconv.AppendInt(b, int64(len(a)), 10)
		b = append(b, "\r\n"...)
		b = append(b, a...)
		b = append(b, "\r\n"...)
	}
	return b
}

// readyConn is a connection whose HELLO was sent and answered at dial time.
type readyConn struct {
	net.Conn

	mu    sync.Mutex
	hello []byte // the HELLO sent ahead; nil once the first write was seen
	reply []byte // its reply
	rest  []byte // bytes read past the reply
	read  []byte // what Read returns before the socket's bytes
}

// Write absorbs the first write when it starts with the HELLO sent ahead and
// queues its reply for Read; any other first write drops the reply.
func (c *readyConn) Write(p []byte) (int, error) {
	c.mu.Lock()
	if c.hello == nil {
		c.mu.Unlock()
		return c.Conn.Write(p)
	}
	hello := c.hello
	c.hello = nil
	if !bytes.HasPrefix(p, hello) {
		c.read = c.rest
		c.mu.Unlock()
		return c.Conn.Write(p)
	}
	c.read = append(c.reply, c.rest...)
	c.mu.Unlock()
	if len(p) == len(hello) {
		return len(p), nil
	}
	n, err := c.Conn.Write(p[len(hello):])
	return len(hello) + n, err
}

func (c *readyConn) Read(p []byte) (int, error) {
	c.mu.Lock()
	if len(c.read) > 0 {
		n := copy(p, c.read)
		c.read = c.read[n:]
		c.mu.Unlock()
		return n, nil
	}
	c.mu.Unlock()
	return c.Conn.Read(p)
}

// withSyscall returns w, a wrapper of inner, as a syscall.Conn exactly when
// inner is one. go-redis's pool peeks at the socket of an idle connection
// that is a syscall.Conn before handing it out, and takes any error of
// SyscallConn for a dead connection: a wrapper claiming one over a TLS
// connection or over another wrapper made every idle connection stale, so
// the pool closed it and dialed anew for nearly every command (issue 38: a
// Sentinel client dialed ≈ 1,800 connections a second at 1,000 commands a
// second). A connection that is no syscall.Conn is not peeked at, as go-redis
// does for TLS.
func withSyscall(w, inner net.Conn) net.Conn {
	if sc, ok := inner.(syscall.Conn); ok {
		return sysConn{Conn: w, sc: sc}
	}
	return w
}

// sysConn is a wrapper whose socket can be peeked at (withSyscall).
type sysConn struct {
	net.Conn
	sc syscall.Conn
}

func (c sysConn) SyscallConn() (syscall.RawConn, error) { return c.sc.SyscallConn() }

// NetConn is the wrapper below, for go-redis's unwrapping.
func (c sysConn) NetConn() net.Conn { return c.Conn }

// NetConn is the connection below, for go-redis's unwrapping.
func (c *readyConn) NetConn() net.Conn { return c.Conn }

// defaultDialer is go-redis's own dialer (redis.NewDialer) for these options:
// TCP with keep-alive, TLS when configured.
func defaultDialer(dialTimeout time.Duration, tlsConf *tls.Config) dialFunc {
	return redis.NewDialer(&redis.Options{DialTimeout: dialTimeout, TLSConfig: tlsConf})
}

// copyReply copies one whole RESP2/RESP3 reply from r to w: simple lines
// (+ - : _ , # ( ), blobs ($ ! =, length -1 for null), aggregates (* ~ >
// with n elements, % and | with n pairs; an attribute | precedes the value
// it annotates).
func copyReply(w *bytes.Buffer, r *bufio.Reader) error {
	line, err := r.ReadSlice('\n')
	if err != nil {
		return err
	}
	if len(line) < 3 || line[len(line)-2] != '\r' {
		return fmt.Errorf("malformed reply line %q", line)
	}
	w.Write(line)
	body := line[1 : len(line)-2]
	switch line[0] {
	case '+', '-', ':', '_', ',', '#', '(':
		return nil
	case '$', '!', '=':
		n, err := strconv.Atoi(string(body))
		if err != nil {
			return fmt.Errorf("malformed blob length %q", body)
		}
		if n < 0 {
			return nil
		}
		_, err = io.CopyN(w, r, int64(n)+2)
		return err
	case '*', '~', '>', '%', '|':
		n, err := strconv.Atoi(string(body))
		if err != nil {
			return fmt.Errorf("malformed aggregate length %q", body)
		}
		if line[0] == '%' || line[0] == '|' {
			n *= 2
		}
		if line[0] == '|' {
			n++ // the value the attribute annotates
		}
		for range max(n, 0) {
			if err := copyReply(w, r); err != nil {
				return err
			}
		}
		return nil
	}
	return fmt.Errorf("unknown reply type %q", line[0])
}
