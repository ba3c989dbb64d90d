package netstamp

import (
	"errors"
	"net"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// TestRecvmsgStampsWhenTheBytesCame: bytes that wait in the socket are
// stamped with their arrival, not with the read that takes them later; a
// read returning two writes is stamped with the later one's.
func TestRecvmsgStampsWhenTheBytesCame(t *testing.T) {
	client, server := stacktest.TCPPair(t)
	rc, err := server.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	require.NoError(t, Enable(rc))

	read := func() (int, time.Time) {
		buf, oob := make([]byte, 64), make([]byte, Space)
		var n int
		var at time.Time
		var rerr error
		require.NoError(t, rc.Read(func(fd uintptr) bool {
			n, at, rerr = Recvmsg(int(fd), buf, oob)
			return !errors.Is(rerr, syscall.EAGAIN)
		}))
		require.NoError(t, rerr)
		return n, at
	}

	// The kernel starts stamping a moment after the first socket asks for
	// it (net_enable_timestamp defers the switch); reads before carry none.
	require.Eventually(t, func() bool {
		_, err := client.Write([]byte("x"))
		require.NoError(t, err)
		time.Sleep(time.Millisecond)
		_, at := read()
		return !at.IsZero()
	}, 5*time.Second, 10*time.Millisecond)

	sent := time.Now()
	_, err = client.Write([]byte("one"))
	require.NoError(t, err)
	time.Sleep(100 * time.Millisecond) // waits in the socket
	n, at := read()
	require.Equal(t, 3, n)
	require.False(t, at.Before(sent.Truncate(time.Microsecond)), "stamped %s before it was sent", sent.Sub(at))
	require.Less(t, at.Sub(sent), 50*time.Millisecond, "stamped when read, not when it came")

	_, err = client.Write([]byte("two"))
	require.NoError(t, err)
	time.Sleep(30 * time.Millisecond)
	second := time.Now()
	_, err = client.Write([]byte("three"))
	require.NoError(t, err)
	time.Sleep(30 * time.Millisecond)
	n, at = read()
	require.Equal(t, 8, n)
	require.False(t, at.Before(second.Truncate(time.Microsecond)), "a read is stamped with its last segment's arrival")
}

func TestStampIgnoresOtherMessages(t *testing.T) {
	require.True(t, stamp(nil).IsZero())
	require.True(t, stamp(make([]byte, 3)).IsZero())
}
