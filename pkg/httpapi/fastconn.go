package httpapi

import (
	"errors"
	"io"
	"net"
	"os"
	"sync"
	"syscall"
	"time"
)

// fastListener hands out fastConns: ServeFast's connections.
type fastListener struct{ net.Listener }

func (l fastListener) Accept() (net.Conn, error) {
	c, err := l.Listener.Accept()
	if err != nil {
		return nil, err
	}
	return newFastConn(c), nil
}

// fastConn is a connection over a socket that reads what the socket holds
// in one system call, and puts a deadline on the socket only when a read
// or a write is about to wait.
//
// fasthttp with ReduceMemoryUsage (NewFastServer) holds no buffer while a
// keep-alive connection is idle: it waits for a request's first byte with
// a one-byte read and reads the rest in a second, and it sets a read
// deadline three times a request (the idle wait's, the header's and, in
// HeaderReceived, the body's) and a write deadline once, each a runtime
// timer moved under a lock. The second read was 4–5 % of the limiter's CPU
// in the pinned peerbench, the deadlines 3–4 % (issue 34). Here a read
// shorter than readAheadMin reads the whole request into a pooled buffer,
// taken only once the socket is readable (the raw connection's Read calls
// back when it is) and put back as soon as its bytes are read, so an idle
// connection still holds none; and a deadline set is recorded, and reaches
// the socket when a read finds nothing to read or a write finds the socket
// full — a request that arrives whole and an answer the socket takes at
// once move no timer.
//
// A deadline bounds every wait for the socket as on the connection itself,
// also one set while a read or write waits. What differs: a read or write
// that needs no wait succeeds even when the deadline recorded has passed,
// where the connection would fail it (fasthttp sets each deadline ahead of
// the reads and writes it bounds). A connection that is not a socket is
// used as it is. Like a net.Conn: one reader and one writer at a time.
type fastConn struct {
	net.Conn
	raw syscall.RawConn // nil: not a socket, every call is Conn's

	// The reader's: buf is pooled, nil when nothing is pending; pending
	// the bytes read ahead, not yet returned. readFD is c.readFrom bound
	// once (a method value bound per call would be an allocation per
	// call); into is where it reads (nil: a pooled buffer), n and err its
	// result.
	buf     *[]byte
	pending []byte
	readFD  func(fd uintptr) bool
	into    []byte
	n       int
	err     error

	// The writer's: writeFD is c.writeTo bound once; out is what it
	// writes, wn how much of it is written, werr its error.
	writeFD func(fd uintptr) bool
	out     []byte
	wn      int
	werr    error

	mu          sync.Mutex
	read, write lazyDeadline
}

// lazyDeadline is one direction's deadline: the one set, and the socket's.
type lazyDeadline struct {
	write         bool // the write deadline; else the read deadline
	want, applied time.Time
	waiting       bool // a call waits for the socket: a deadline set goes to it at once
	// waited: the call under way found the socket empty (a read) or full
	// (a write); the direction's own, not under mu.
	waited bool
}

// readAheadMin is the shortest read that reads into the caller's buffer
// directly: a bufio.Reader's fill (fasthttp's is 4 KiB or more) needs no
// read-ahead.
const readAheadMin = 512

// readAheadSize is the pooled buffer: a check with its headers fits.
const readAheadSize = 4 << 10

var readAheadBufs = sync.Pool{New: func() any { b := make([]byte, readAheadSize); return &b }}

func newFastConn(c net.Conn) net.Conn {
	fc := &fastConn{Conn: c}
	fc.readFD, fc.writeFD = fc.readFrom, fc.writeTo
	fc.write.write = true
	inner := c
	for {
		u, ok := inner.(interface{ Unwrap() net.Conn })
		if !ok {
			break
		}
		inner = u.Unwrap()
	}
	if sc, ok := inner.(syscall.Conn); ok {
		if raw, err := sc.SyscallConn(); err == nil {
			fc.raw = raw
		}
	}
	return fc
}

// Unwrap is the connection below (CallerGoneConn reads its socket).
func (c *fastConn) Unwrap() net.Conn { return c.Conn }

func (c *fastConn) Read(p []byte) (int, error) {
	if len(c.pending) > 0 {
		n := copy(p, c.pending)
		c.pending = c.pending[n:]
		if len(c.pending) == 0 {
			c.release()
		}
		return n, nil
	}
	if c.raw == nil {
		return c.Conn.Read(p)
	}
	if len(p) == 0 {
		return 0, nil
	}
	c.into = nil
	if len(p) >= readAheadMin {
		c.into = p
	}
	err := c.onSocket(&c.read)
	if err == nil {
		err = c.err
	}
	n := c.n
	c.err, c.into = nil, nil
	if err != nil || n <= 0 {
		c.release()
		if err == nil {
			err = io.EOF
		}
		return 0, c.wrapErr("read", err)
	}
	if len(p) >= readAheadMin {
		return n, nil
	}
	c.pending = (*c.buf)[:n]
	return c.Read(p)
}

// readFrom is the raw connection's read callback, called when the socket
// may be readable (and again after each wait while it is not): it reads
// what the socket holds — into c.into, or a pooled buffer taken only now —
// and reports false, wait and call again, when there was nothing, first
// putting the read deadline set on the socket.
func (c *fastConn) readFrom(fd uintptr) bool {
	dst := c.into
	var bp *[]byte
	if dst == nil {
		bp = readAheadBufs.Get().(*[]byte)
		dst = *bp
	}
	var err error
	for {
		c.n, err = syscall.Read(int(fd), dst)
		if err != syscall.EINTR {
			break
		}
	}
	if err == syscall.EAGAIN {
		if bp != nil {
			readAheadBufs.Put(bp)
		}
		if !c.read.waited {
			c.read.waited = true
			if err := c.wait(&c.read); err != nil {
				c.n, c.err = 0, err
				return true
			}
		}
		return false
	}
	if bp != nil {
		c.buf = bp
	}
	c.err = err
	return true
}

func (c *fastConn) Write(p []byte) (int, error) {
	if c.raw == nil {
		return c.Conn.Write(p)
	}
	c.out, c.wn, c.werr = p, 0, nil
	err := c.onSocket(&c.write)
	if err == nil {
		err = c.werr
	}
	n := c.wn
	c.out, c.werr = nil, nil
	if err != nil {
		return n, c.wrapErr("write", err)
	}
	return n, nil
}

// writeTo is the raw connection's write callback: it writes what is left
// of c.out and reports false, wait and call again, when the socket is full,
// first putting the write deadline set on the socket.
func (c *fastConn) writeTo(fd uintptr) bool {
	for c.wn < len(c.out) {
		n, err := syscall.Write(int(fd), c.out[c.wn:])
		if n > 0 {
			c.wn += n
		}
		switch err {
		case nil:
		case syscall.EINTR:
		case syscall.EAGAIN:
			if !c.write.waited {
				c.write.waited = true
				if err := c.wait(&c.write); err != nil {
					c.werr = err
					return true
				}
			}
			return false
		default:
			c.werr = err
			return true
		}
	}
	return true
}

// onSocket runs d's direction's callback (readFrom or writeTo) on the raw
// connection, and once more when it failed on a deadline the socket kept
// from an earlier wait (stale).
func (c *fastConn) onSocket(d *lazyDeadline) error {
	var err error
	for try := 0; try < 2; try++ {
		d.waited = false
		if d.write {
			err = c.raw.Write(c.writeFD)
		} else {
			err = c.raw.Read(c.readFD)
		}
		if d.waited {
			c.done(d)
		}
		if err == nil || !c.stale(d, err) {
			break
		}
	}
	return err
}

// wait marks d's direction waiting and puts its deadline on the socket.
func (c *fastConn) wait(d *lazyDeadline) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d.waiting = true
	return c.apply(d)
}

// done ends d's direction's wait.
func (c *fastConn) done(d *lazyDeadline) {
	c.mu.Lock()
	d.waiting = false
	c.mu.Unlock()
}

// stale reports, for a call that failed with err, whether it failed on a
// deadline the socket kept from an earlier wait, not the one set since —
// which it then puts on the socket, so that the call is made again.
func (c *fastConn) stale(d *lazyDeadline, err error) bool {
	if !errors.Is(err, os.ErrDeadlineExceeded) {
		return false
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if d.want.Equal(d.applied) {
		return false
	}
	return c.apply(d) == nil
}

// apply puts d's deadline set on the socket; c.mu is held.
func (c *fastConn) apply(d *lazyDeadline) error {
	if d.want.Equal(d.applied) {
		return nil
	}
	var err error
	if d.write {
		err = c.Conn.SetWriteDeadline(d.want)
	} else {
		err = c.Conn.SetReadDeadline(d.want)
	}
	if err != nil {
		return err
	}
	d.applied = d.want
	return nil
}

// record sets d's deadline to t: on the socket at once when a call waits.
func (c *fastConn) record(d *lazyDeadline, t time.Time) error {
	c.mu.Lock()
	defer c.mu.Unlock()
	d.want = t
	if d.waiting {
		return c.apply(d)
	}
	return nil
}

// SetReadDeadline records t; it reaches the socket when a read waits.
func (c *fastConn) SetReadDeadline(t time.Time) error {
	if c.raw == nil {
		return c.Conn.SetReadDeadline(t)
	}
	return c.record(&c.read, t)
}

// SetWriteDeadline records t; it reaches the socket when a write waits.
func (c *fastConn) SetWriteDeadline(t time.Time) error {
	if c.raw == nil {
		return c.Conn.SetWriteDeadline(t)
	}
	return c.record(&c.write, t)
}

// SetDeadline is SetReadDeadline and SetWriteDeadline.
func (c *fastConn) SetDeadline(t time.Time) error {
	if c.raw == nil {
		return c.Conn.SetDeadline(t)
	}
	if err := c.SetReadDeadline(t); err != nil {
		return err
	}
	return c.SetWriteDeadline(t)
}

// wrapErr gives an error the form the connection's own Read and Write give
// it: a *net.OpError around it (the raw connection's are one already).
func (c *fastConn) wrapErr(op string, err error) error {
	var oe *net.OpError
	if errors.Is(err, io.EOF) || errors.As(err, &oe) {
		return err
	}
	var errno syscall.Errno
	if errors.As(err, &errno) {
		err = os.NewSyscallError(op, errno)
	}
	return &net.OpError{Op: op, Net: c.LocalAddr().Network(), Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
}

// release puts the read-ahead buffer back in the pool. (Close does not: it
// may run beside a read, from fasthttp's shutdown; a connection closed with
// bytes pending leaves its buffer to the collector.)
func (c *fastConn) release() {
	if c.buf != nil {
		readAheadBufs.Put(c.buf)
		c.buf, c.pending = nil, nil
	}
}
