//go:build !linux

package netstamp

import (
	"errors"
	"syscall"
	"time"
)

// Space is the size of the control buffer Recvmsg needs.
var Space = 0

// Enable fails: receive stamps need Linux's SO_TIMESTAMPNS.
func Enable(syscall.RawConn) error { return errors.ErrUnsupported }

// Recvmsg is never called where Enable failed.
func Recvmsg(int, []byte, []byte) (int, time.Time, error) {
	return 0, time.Time{}, errors.ErrUnsupported
}
