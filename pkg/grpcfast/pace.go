package grpcfast

// Paced reading: past saturation, a server that reads every call spends its
// CPU on reading and refusing calls it cannot decide (over a thousand
// connections, a read, its empty read and a write for each), while the
// calls it could decide wait behind the readers. With a ReadPacer, a
// connection whose socket has become readable waits for a turn before it
// reads: the server reads what it can decide, newest first, and what it
// cannot stays in the kernel, where it costs nothing until it is read with
// the rest of its connection's backlog, in one read.

import (
	"errors"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"syscall"
	"time"

	"google.golang.org/grpc/metadata"

	"github.com/floodgate-dev/floodgate/pkg/netstamp"
)

// ReadPacer paces what the connections read (Config.ReadPacer).
type ReadPacer interface {
	// Turn returns when a connection whose socket has become readable may
	// read it, or at once when done is closed (the connection is closing).
	// It is not asked for the reads that follow one that returned data:
	// those read the rest of a backlog already let in. When it returns
	// true the turn counts until the connection calls Done: once it has
	// handled what the turn read (it reads again, or closes).
	Turn(done <-chan struct{}) (counted bool)
	// Done ends a counted turn.
	Done()
	// Dispatched is told of each call a paced connection's reader hands to
	// a worker, and Started when the worker starts it: between the two
	// the call waits for the CPU, and a pacer that gave turns only by what
	// its queue holds would let reads run ahead of the workers (their calls
	// runnable by the hundred, past their deadlines before they start).
	Dispatched()
	Started()
	// Unpaced reports whether a call's metadata takes its connection out
	// of pacing for good (a gateway's cluster for its CRITICAL routes). A
	// connection is read unpaced until its first call that is not: what it
	// is cannot be known before a call is read, and a connection of the
	// CRITICAL cluster that waited a turn for its first call — as each of
	// a thousand new connections would under overload — was late.
	Unpaced(md metadata.MD) bool
}

// A paced connection's states: read unpaced until a call shows what it is.
const (
	paceUndecided int32 = iota // no call yet: unpaced
	paceOn                     // a call not for the CRITICAL cluster: paced
	paceOff                    // a call for the CRITICAL cluster: unpaced for good
)

// pacedConn is an accepted TCP connection whose reads wait for the pacer's
// turn once the socket has had nothing to read. Only the connection's
// reader reads it.
type pacedConn struct {
	net.Conn
	rc    syscall.RawConn
	pacer ReadPacer
	state atomic.Int32 // paceUndecided, paceOn or paceOff
	owed  atomic.Bool  // a counted turn not yet ended (Done)
	done  chan struct{}
	once  sync.Once

	// The reader's own, for readFrom (readFn: made once, not per read).
	readFn func(fd uintptr) bool
	buf    []byte
	n      int
	err    error
	woken  bool
	// arrived is when the kernel received the last read's bytes, if that
	// read had found the socket empty and waited: the first call it brought
	// had come by then (zero: not known, or taken by that call's HEADERS).
	// It is the receive time of the read's last segment (netstamp), never
	// the wake: a wake can be an edge left from bytes an earlier read took,
	// and a call that came while its connection waited for a turn after it
	// would be dated before it was sent.
	arrived time.Time
	oob     []byte // the receive time's control buffer; nil: the system gives none
}

// pace wraps nc in a pacedConn, or returns nil when neither nc nor a
// connection it wraps (Unwrap, as a listener's that counts connections)
// has a raw socket. The pacedConn reads the socket itself and leaves the
// rest (Close above all) to nc.
func pace(nc net.Conn, p ReadPacer) *pacedConn {
	for inner := nc; inner != nil; {
		if sc, ok := inner.(syscall.Conn); ok {
			rc, err := sc.SyscallConn()
			if err != nil {
				return nil
			}
			c := &pacedConn{Conn: nc, rc: rc, pacer: p, done: make(chan struct{})}
			c.readFn = c.readFrom
			if netstamp.Enable(rc) == nil {
				c.oob = make([]byte, netstamp.Space)
			}
			return c
		}
		u, ok := inner.(interface{ Unwrap() net.Conn })
		if !ok {
			return nil
		}
		inner = u.Unwrap()
	}
	return nil
}

// Read reads what the socket holds into b; when it holds nothing, it waits
// until the socket is readable and then, once the connection is paced, for
// the pacer's turn.
func (c *pacedConn) Read(b []byte) (int, error) {
	c.settle() // what the last turn read is handled
	c.arrived = time.Time{}
	if c.state.Load() != paceOn || len(b) == 0 {
		return c.Conn.Read(b)
	}
	c.buf, c.woken = b, false
	err := c.rc.Read(c.readFn)
	n := c.n
	if err == nil {
		err = c.err
	}
	c.buf, c.err = nil, nil
	if err != nil {
		if !errors.Is(err, io.EOF) {
			err = &net.OpError{Op: "read", Net: "tcp", Source: c.LocalAddr(), Addr: c.RemoteAddr(), Err: err}
		}
		return 0, err
	}
	return n, nil
}

// readFrom is the raw connection's read callback: called at once, and again
// each time the socket may have become readable after it reported false.
// Only those later calls wait for the pacer's turn.
func (c *pacedConn) readFrom(fd uintptr) bool {
	waited := c.woken
	if waited {
		c.settle() // a turn that found nothing
		c.owed.Store(c.pacer.Turn(c.done))
	}
	c.woken = true
	var at time.Time
	var err error
	for {
		if c.oob != nil {
			c.n, at, err = netstamp.Recvmsg(int(fd), c.buf, c.oob)
		} else {
			c.n, err = syscall.Read(int(fd), c.buf)
		}
		if !errors.Is(err, syscall.EINTR) {
			break
		}
	}
	switch {
	case errors.Is(err, syscall.EAGAIN):
		return false
	case err != nil:
		c.n, c.err = 0, err
	case c.n == 0:
		c.err = io.EOF
	case waited:
		c.arrived = at
	}
	return true
}

// arrival returns, once, when the first call of the last read arrived,
// if the read had waited for the socket (zero otherwise). The reader asks
// on a call's HEADERS: a call that waited for its turn past its deadline
// is then past it when read, and is answered without a worker.
func (c *pacedConn) arrival() time.Time {
	at := c.arrived
	c.arrived = time.Time{}
	return at
}

// settle ends the connection's counted turn, if it holds one.
func (c *pacedConn) settle() {
	if c.owed.CompareAndSwap(true, false) {
		c.pacer.Done()
	}
}

// sawCall moves the connection on a call read whole (or refused at the
// door, which reads no more of it): paced from its first call
// that is not for the CRITICAL cluster, unpaced for good from one that is.
func (c *pacedConn) sawCall(md metadata.MD) {
	if c.state.Load() == paceOff {
		return
	}
	if md != nil && c.pacer.Unpaced(md) {
		c.state.Store(paceOff)
		return
	}
	c.state.CompareAndSwap(paceUndecided, paceOn)
}

// critical reports whether c is a connection of a gateway's CRITICAL
// cluster (ReadPacer.Unpaced): it writes an answer at once, without the
// yield that lets the connection's other calls ready now join the write. Its
// calls are few, and on a saturated core that yield is a whole turn of the
// run queue, which a CRITICAL call would wait behind everyone else's.
func (c *conn) critical() bool {
	return c.paced != nil && c.paced.state.Load() == paceOff
}

// Close closes the connection, ending a wait for a turn.
func (c *pacedConn) Close() error {
	c.once.Do(func() { close(c.done) })
	c.settle()
	return c.Conn.Close()
}
