package httpapi

import (
	"errors"
	"io"
	"net"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// fastPair is a loopback TCP connection: the server's side read ahead,
// and the client's.
func fastPair(t *testing.T) (*fastConn, net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	client, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	sc, err := fastListener{ln}.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { _ = client.Close(); _ = sc.Close() })
	c := sc.(*fastConn)
	require.NotNil(t, c.raw, "a TCP connection reads ahead")
	return c, client
}

// TestFastConnReadsAsTheConnection: what a reader gets through the
// connection is the byte stream the peer sent, whatever the sizes of its
// reads; a read's deadline, the peer's close and an empty read behave as
// on the connection itself, and an idle connection holds no buffer.
func TestFastConnReadsAsTheConnection(t *testing.T) {
	t.Run("one byte, then the rest from the read-ahead", func(t *testing.T) {
		c, client := fastPair(t)
		_, err := io.WriteString(client, "POST /v1/check HTTP/1.1\r\n\r\n")
		require.NoError(t, err)
		var b [1]byte
		n, err := c.Read(b[:])
		require.NoError(t, err)
		require.Equal(t, 1, n)
		require.Equal(t, byte('P'), b[0])
		require.NotNil(t, c.buf, "the rest is pending")
		rest := make([]byte, 4096)
		n, err = c.Read(rest)
		require.NoError(t, err)
		require.Equal(t, "OST /v1/check HTTP/1.1\r\n\r\n", string(rest[:n]))
		require.Nil(t, c.buf, "the buffer went back once read")
	})
	t.Run("small reads drain the read-ahead in order", func(t *testing.T) {
		c, client := fastPair(t)
		_, err := io.WriteString(client, "abcdefgh")
		require.NoError(t, err)
		var got []byte
		for len(got) < 8 {
			b := make([]byte, 3)
			n, err := c.Read(b)
			require.NoError(t, err)
			got = append(got, b[:n]...)
		}
		require.Equal(t, "abcdefgh", string(got))
		require.Nil(t, c.buf)
	})
	t.Run("more than a buffer", func(t *testing.T) {
		c, client := fastPair(t)
		want := make([]byte, 3*readAheadSize+17)
		for i := range want {
			want[i] = byte(i)
		}
		go func() { _, _ = client.Write(want); _ = client.Close() }()
		var got []byte
		for {
			b := make([]byte, 1+len(got)%700) // small and large reads
			n, err := c.Read(b)
			got = append(got, b[:n]...)
			if errors.Is(err, io.EOF) {
				break
			}
			require.NoError(t, err)
		}
		require.Equal(t, want, got)
	})
	t.Run("deadline", func(t *testing.T) {
		c, _ := fastPair(t)
		err := readTimesOut(t, c, 50*time.Millisecond)
		var ne net.Error
		require.True(t, errors.As(err, &ne) && ne.Timeout())
		require.Nil(t, c.buf, "an idle connection holds no buffer")
	})
	t.Run("a deadline set while a read waits ends the wait", func(t *testing.T) {
		c, _ := fastPair(t)
		lateDeadlineEndsTheWait(t, c.SetReadDeadline, func() error {
			var b [1]byte
			_, err := c.Read(b[:])
			return err
		})
	})
	t.Run("a deadline bounds a large read's wait too", func(t *testing.T) {
		c, _ := fastPair(t)
		require.NoError(t, c.SetDeadline(time.Now().Add(50*time.Millisecond)))
		_, err := c.Read(make([]byte, 8192))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	})
	t.Run("bytes ready move no timer", func(t *testing.T) {
		c, client := fastPair(t)
		_, err := io.WriteString(client, "GET / HTTP/1.1\r\n\r\n")
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond) // arrived
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
		var b [1]byte
		_, err = c.Read(b[:])
		require.NoError(t, err)
		require.True(t, c.read.applied.IsZero(), "the deadline was not put on the socket")
		require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
		rest := make([]byte, 1024)
		n, err := c.Read(rest)
		require.NoError(t, err)
		require.Equal(t, "ET / HTTP/1.1\r\n\r\n", string(rest[:n]))
		require.True(t, c.read.applied.IsZero())
	})
	t.Run("a passed deadline of an earlier wait does not fail a read under a new one", func(t *testing.T) {
		c, client := fastPair(t)
		readTimesOut(t, c, 20*time.Millisecond)
		var b [1]byte
		require.NoError(t, c.SetReadDeadline(time.Now().Add(5*time.Second)))
		_, err := io.WriteString(client, "x")
		require.NoError(t, err)
		time.Sleep(20 * time.Millisecond)
		n, err := c.Read(b[:])
		require.NoError(t, err)
		require.Equal(t, "x", string(b[:n]))
		require.NoError(t, c.SetReadDeadline(time.Time{}))
		go func() { time.Sleep(50 * time.Millisecond); _, _ = io.WriteString(client, "y") }()
		n, err = c.Read(b[:]) // waits with no deadline
		require.NoError(t, err)
		require.Equal(t, "y", string(b[:n]))
	})
	t.Run("the peer's close is EOF", func(t *testing.T) {
		c, client := fastPair(t)
		require.NoError(t, client.Close())
		var b [1]byte
		n, err := c.Read(b[:])
		require.Zero(t, n)
		require.ErrorIs(t, err, io.EOF)
	})
	t.Run("an empty read", func(t *testing.T) {
		c, _ := fastPair(t)
		n, err := c.Read(nil)
		require.Zero(t, n)
		require.NoError(t, err)
	})
	t.Run("not a socket: reads as before", func(t *testing.T) {
		a, b := net.Pipe()
		defer a.Close()
		defer b.Close()
		c := newFastConn(a).(*fastConn)
		require.Nil(t, c.raw)
		go func() { _, _ = io.WriteString(b, "xy") }()
		var p [1]byte
		n, err := c.Read(p[:])
		require.NoError(t, err)
		require.Equal(t, "x", string(p[:n]))
	})
	t.Run("the socket below is found for CallerGone", func(t *testing.T) {
		c, client := fastPair(t)
		require.False(t, CallerGoneConn(c))
		require.NoError(t, client.Close())
		require.Eventually(t, func() bool { return CallerGoneConn(c) }, time.Second, 10*time.Millisecond)
	})
}

// TestFastConnWritesAsTheConnection: what the peer reads is what was
// written; a write the socket takes at once moves no timer, and a write
// that waits for a full socket is bounded by the write deadline, also one
// set while it waits.
func TestFastConnWritesAsTheConnection(t *testing.T) {
	t.Run("written whole, no timer", func(t *testing.T) {
		c, client := fastPair(t)
		require.NoError(t, c.SetWriteDeadline(time.Now().Add(time.Second)))
		n, err := c.Write([]byte("HTTP/1.1 200 OK\r\n\r\n"))
		require.NoError(t, err)
		require.Equal(t, 19, n)
		require.True(t, c.write.applied.IsZero(), "the deadline was not put on the socket")
		got := make([]byte, 19)
		_, err = io.ReadFull(client, got)
		require.NoError(t, err)
		require.Equal(t, "HTTP/1.1 200 OK\r\n\r\n", string(got))
	})
	t.Run("more than the socket holds, read as it is written", func(t *testing.T) {
		c, client := fastPair(t)
		want := make([]byte, 8<<20)
		for i := range want {
			want[i] = byte(i * 7)
		}
		got := make(chan []byte, 1)
		go func() { b, _ := io.ReadAll(client); got <- b }()
		require.NoError(t, c.SetWriteDeadline(time.Now().Add(10*time.Second)))
		n, err := c.Write(want)
		require.NoError(t, err)
		require.Equal(t, len(want), n)
		require.NoError(t, c.Close())
		require.Equal(t, want, <-got)
	})
	t.Run("a full socket waits until the deadline", func(t *testing.T) {
		c, _ := fastPair(t) // the peer never reads
		require.NoError(t, c.SetWriteDeadline(time.Now().Add(100*time.Millisecond)))
		n, err := c.Write(make([]byte, 64<<20))
		require.ErrorIs(t, err, os.ErrDeadlineExceeded)
		require.Positive(t, n)
		require.Less(t, n, 64<<20)
	})
	t.Run("a deadline set while a write waits ends the wait", func(t *testing.T) {
		c, _ := fastPair(t)
		lateDeadlineEndsTheWait(t, c.SetDeadline, func() error {
			_, err := c.Write(make([]byte, 64<<20))
			return err
		})
	})
	t.Run("the peer's reset is an error", func(t *testing.T) {
		c, client := fastPair(t)
		require.NoError(t, client.(*net.TCPConn).SetLinger(0))
		require.NoError(t, client.Close())
		time.Sleep(20 * time.Millisecond)
		var err error
		for range 100 {
			if _, err = c.Write([]byte("x")); err != nil {
				break
			}
		}
		require.Error(t, err)
		var oe *net.OpError
		require.ErrorAs(t, err, &oe)
	})
}

// lateDeadlineEndsTheWait runs op, which waits for the socket, and sets a
// deadline with set 50 ms into its wait: op must fail on it, soon.
func lateDeadlineEndsTheWait(t *testing.T, set func(time.Time) error, op func() error) {
	t.Helper()
	go func() {
		time.Sleep(50 * time.Millisecond)
		_ = set(time.Now().Add(20 * time.Millisecond))
	}()
	start := time.Now()
	require.ErrorIs(t, op(), os.ErrDeadlineExceeded)
	require.Less(t, time.Since(start), 2*time.Second)
}

// readTimesOut reads a byte with a read deadline d away from a connection
// the peer sends nothing on: the read must fail on the deadline.
func readTimesOut(t *testing.T, c *fastConn, d time.Duration) error {
	t.Helper()
	require.NoError(t, c.SetReadDeadline(time.Now().Add(d)))
	var b [1]byte
	_, err := c.Read(b[:])
	require.ErrorIs(t, err, os.ErrDeadlineExceeded)
	return err
}
