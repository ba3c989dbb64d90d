package envoyclient

import (
	"errors"
	"io"
	"net"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/netstamp"
)

// stampReader reads a TCP connection with its kernel receive times
// (netstamp) and keeps the last read's: when an answer reached this
// machine, whatever this process's own run queue made its reading
// goroutine wait after that. Only the connection's reading goroutine
// uses it.
type stampReader struct {
	rc   syscall.RawConn
	oob  []byte
	last time.Time
}

// newStampReader is nc's reader with receive times, or nc itself (and no
// times) when nc is not TCP or the system gives none.
func newStampReader(nc net.Conn) (io.Reader, func() time.Time) {
	none := func() time.Time { return time.Time{} }
	tc, ok := nc.(*net.TCPConn)
	if !ok {
		return nc, none
	}
	rc, err := tc.SyscallConn()
	if err != nil || netstamp.Enable(rc) != nil {
		return nc, none
	}
	s := &stampReader{rc: rc, oob: make([]byte, netstamp.Space)}
	return s, func() time.Time { return s.last }
}

func (s *stampReader) Read(p []byte) (int, error) {
	var n int
	var at time.Time
	var err error
	if rerr := s.rc.Read(func(fd uintptr) bool {
		n, at, err = netstamp.Recvmsg(int(fd), p, s.oob)
		return !errors.Is(err, syscall.EAGAIN)
	}); rerr != nil {
		return 0, rerr
	}
	if err != nil {
		return 0, err
	}
	if n == 0 && len(p) > 0 {
		return 0, io.EOF
	}
	if !at.IsZero() {
		s.last = at
	}
	return n, nil
}
