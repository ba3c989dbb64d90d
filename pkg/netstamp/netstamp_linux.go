package netstamp

import (
	"encoding/binary"
	"syscall"
	"time"
	"unsafe"

	"golang.org/x/sys/unix"
)

// Space is the size of the control buffer Recvmsg needs.
var Space = unix.CmsgSpace(16)

// Enable asks the kernel to stamp what the socket receives.
func Enable(rc syscall.RawConn) error {
	var serr error
	if err := rc.Control(func(fd uintptr) {
		serr = unix.SetsockoptInt(int(fd), unix.SOL_SOCKET, unix.SO_TIMESTAMPNS_NEW, 1)
	}); err != nil {
		return err
	}
	return serr
}

// Recvmsg reads what the socket holds into p, as read(2) would, with oob
// (Space bytes) for the stamp; at is zero when the read carried none (the
// kernel starts stamping a moment after the first socket on the machine
// asks: net_enable_timestamp defers the switch), and carries a monotonic
// clock reading otherwise.
func Recvmsg(fd int, p, oob []byte) (n int, at time.Time, err error) {
	n, oobn, _, _, err := unix.Recvmsg(fd, p, oob, 0)
	if err != nil {
		return n, time.Time{}, err
	}
	at = stamp(oob[:oobn])
	if !at.IsZero() {
		// On the monotonic clock, as time.Now's: a deadline counted from
		// it does not move with the wall clock.
		now := time.Now()
		at = now.Add(-now.Sub(at))
	}
	return n, at, nil
}

// stamp is the SO_TIMESTAMPNS_NEW control message's time in oob, if any
// (unix.ParseSocketControlMessage would allocate on every read).
func stamp(oob []byte) time.Time {
	for len(oob) >= unix.SizeofCmsghdr {
		h := (*unix.Cmsghdr)(unsafe.Pointer(&oob[0]))
		if h.Len < unix.SizeofCmsghdr || int(h.Len) > len(oob) {
			return time.Time{}
		}
		data := oob[unix.CmsgLen(0):h.Len]
		if h.Level == unix.SOL_SOCKET && h.Type == unix.SO_TIMESTAMPNS_NEW && len(data) >= 16 {
			// struct __kernel_timespec: 64-bit seconds and nanoseconds.
			return time.Unix(int64(binary.NativeEndian.Uint64(data)), int64(binary.NativeEndian.Uint64(data[8:])))
		}
		oob = oob[min(unix.CmsgSpace(int(h.Len)-unix.CmsgLen(0)), len(oob)):]
	}
	return time.Time{}
}
