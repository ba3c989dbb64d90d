package redisx

import (
	"bufio"
	"bytes"
	"context"
	"io"
	"net"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

// TestCopyReplyTakesExactlyOneReply: every RESP2/RESP3 reply type is copied
// whole and nothing after it; a cut reply is an error, not a short copy.
func TestCopyReplyTakesExactlyOneReply(t *testing.T) {
	replies := []string{
		"+OK\r\n",
		"-WRONGPASS invalid username-password pair\r\n",
		":42\r\n", "_\r\n", ",3.5\r\n", "#t\r\n", "(123456789012345678901234567890\r\n",
		"$5\r\nhe\r\nl\r\n", "$-1\r\n", "$0\r\n\r\n", "!11\r\nSYNTAX oops\r\n", "=8\r\ntxt:abcd\r\n",
		"*2\r\n$3\r\nfoo\r\n:1\r\n", "*-1\r\n", "~1\r\n+a\r\n", ">2\r\n+message\r\n+x\r\n",
		// HELLO 3's reply: a map with a nested array of maps
		"%3\r\n$6\r\nserver\r\n$5\r\nredis\r\n$5\r\nproto\r\n:3\r\n$7\r\nmodules\r\n*1\r\n%1\r\n$4\r\nname\r\n$2\r\nft\r\n",
		"|1\r\n+ttl\r\n:3600\r\n*1\r\n:1\r\n", // an attribute, then the value it annotates
	}
	for _, r := range replies {
		var out bytes.Buffer
		br := bufio.NewReader(strings.NewReader(r + "+NEXT\r\n"))
		require.NoError(t, copyReply(&out, br), "%q", r)
		require.Equal(t, r, out.String())
		rest, _ := io.ReadAll(br)
		require.Equal(t, "+NEXT\r\n", string(rest), "%q", r)
	}
	for _, cut := range []string{"$5\r\nhel", "*2\r\n:1\r\n", "%1\r\n+a\r\n", "+OK", "$x\r\n", "?\r\n", "\n"} {
		require.Error(t, copyReply(new(bytes.Buffer), bufio.NewReader(strings.NewReader(cut))), "%q", cut)
	}
}

func TestHelloCommandIsGoRedisEncoding(t *testing.T) {
	require.Equal(t, "*2\r\n$5\r\nhello\r\n$1\r\n3\r\n", string(helloCommand(3, "", "")))
	require.Equal(t, "*5\r\n$5\r\nhello\r\n$1\r\n3\r\n$4\r\nauth\r\n$7\r\ndefault\r\n$2\r\npw\r\n", string(helloCommand(3, "", "pw")))
	require.Equal(t, "*5\r\n$5\r\nhello\r\n$1\r\n3\r\n$4\r\nauth\r\n$1\r\nu\r\n$2\r\npw\r\n", string(helloCommand(3, "u", "pw")))
}

// fakeServer answers each command it reads on its end of a pipe with the
// next reply of replies, and records what it read.
func fakeServer(t *testing.T, replies ...string) (dialFunc, *bytes.Buffer) {
	t.Helper()
	got := new(bytes.Buffer)
	return func(context.Context, string, string) (net.Conn, error) {
		client, server := net.Pipe()
		t.Cleanup(func() { _ = server.Close() })
		go func() {
			buf := make([]byte, 4096)
			for _, r := range replies {
				n, err := server.Read(buf)
				if err != nil {
					return
				}
				got.Write(buf[:n])
				if _, err := server.Write([]byte(r)); err != nil {
					return
				}
			}
		}()
		return client, nil
	}, got
}

func readReply(t *testing.T, c net.Conn) string {
	t.Helper()
	var out bytes.Buffer
	require.NoError(t, c.SetReadDeadline(time.Now().Add(time.Second)))
	require.NoError(t, copyReply(&out, bufio.NewReader(c)))
	return out.String()
}

// TestReadyConnAnswersTheSameHelloFromItsDial: the HELLO go-redis writes
// first is not sent again and gets the reply read at dial time; what follows
// it in the same write goes to the server.
func TestReadyConnAnswersTheSameHelloFromItsDial(t *testing.T) {
	hello := helloCommand(3, "", "")
	dial, got := fakeServer(t, "%1\r\n+proto\r\n:3\r\n", "+PONG\r\n")
	c, err := handshakeAhead(dial, hello, time.Second)(context.Background(), "tcp", "x")
	require.NoError(t, err)
	n, err := c.Write(append(bytes.Clone(hello), "*1\r\n$4\r\nping\r\n"...)) // a command writes, then reads
	require.NoError(t, err)
	require.Equal(t, len(hello)+14, n)
	br := bufio.NewReader(c)
	var out bytes.Buffer
	require.NoError(t, copyReply(&out, br))
	require.Equal(t, "%1\r\n+proto\r\n:3\r\n", out.String())
	out.Reset()
	require.NoError(t, copyReply(&out, br))
	require.Equal(t, "+PONG\r\n", out.String())
	require.Equal(t, string(hello)+"*1\r\n$4\r\nping\r\n", got.String(), "HELLO went out once, at the dial")
}

// TestReadyConnPassesAnotherFirstWriteThrough: when go-redis's first write is
// not the HELLO sent ahead (other credentials, another version), the reply
// read ahead is dropped and the write and its reply go through unchanged.
func TestReadyConnPassesAnotherFirstWriteThrough(t *testing.T) {
	dial, got := fakeServer(t, "-WRONGPASS\r\n", "%1\r\n+proto\r\n:2\r\n")
	c, err := handshakeAhead(dial, helloCommand(3, "", "other"), time.Second)(context.Background(), "tcp", "x")
	require.NoError(t, err)
	first := helloCommand(2, "", "")
	_, err = c.Write(first)
	require.NoError(t, err)
	require.Equal(t, "%1\r\n+proto\r\n:2\r\n", readReply(t, c))
	require.True(t, strings.HasSuffix(got.String(), string(first)))
}
