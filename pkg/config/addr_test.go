package config

import (
	"net"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestLoopbackOnly(t *testing.T) {
	for addrs, want := range map[string]bool{
		"127.0.0.1:8085": true, "[::1]:8085": true, "localhost:1": true, "127.9.9.9:1": true, "off": true,
		"unix:/run/floodgate/rls.sock": true, "unix:///run/floodgate/rls.sock": true,
		"0.0.0.0:8085": false, ":8085": false, "10.0.0.1:80": false, "quota:8085": false, "nonsense": false, "unix:": false,
	} {
		if got := LoopbackOnly(addrs); got != want {
			t.Errorf("LoopbackOnly(%q) = %v, want %v", addrs, got, want)
		}
	}
	if LoopbackOnly("127.0.0.1:1", "0.0.0.0:2") {
		t.Error("one address off loopback makes the set not loopback-only")
	}
}

func TestUnixSocket(t *testing.T) {
	for addr, want := range map[string]string{"unix:/a/b.sock": "/a/b.sock", "unix:///a/b.sock": "/a/b.sock", "unix:rel.sock": "rel.sock"} {
		got, ok := UnixSocket(addr)
		require.True(t, ok, addr)
		require.Equal(t, want, got, addr)
	}
	for _, addr := range []string{"127.0.0.1:1", "unix:", "unix://", "off"} {
		_, ok := UnixSocket(addr)
		require.False(t, ok, addr)
	}
}

// Listen on a unix socket takes over a socket file a gone process left, but
// never one another process listens on, nor a file that is not a socket;
// the file goes with the listener.
func TestListenOnAUnixSocket(t *testing.T) {
	dir, err := os.MkdirTemp("", "fgsock") // short: a socket path is at most 107 bytes
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	path := filepath.Join(dir, "rls.sock")
	addr := "unix:" + path

	ln, err := Listen(addr)
	require.NoError(t, err)
	go func() {
		if c, err := ln.Accept(); err == nil {
			_ = c.Close()
		}
	}()
	c, err := net.Dial("unix", path)
	require.NoError(t, err)
	_ = c.Close()
	_, err = Listen(addr)
	require.ErrorContains(t, err, "another process listens on it")
	require.NoError(t, ln.Close())
	_, err = os.Stat(path)
	require.True(t, os.IsNotExist(err), "the listener removed its file")

	// A socket left behind: bound, never unlinked, nobody listening.
	left, err := net.ListenUnix("unix", &net.UnixAddr{Name: path, Net: "unix"})
	require.NoError(t, err)
	left.SetUnlinkOnClose(false)
	require.NoError(t, left.Close())
	_, err = os.Stat(path)
	require.NoError(t, err, "the file stays, as a killed process leaves it")
	ln, err = Listen(addr)
	require.NoError(t, err, "taken over")
	require.NoError(t, ln.Close())

	require.NoError(t, os.WriteFile(path, []byte("data"), 0o600))
	_, err = Listen(addr)
	require.ErrorContains(t, err, "is not a socket")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.Equal(t, "data", string(b), "left alone")

	ln, err = Listen("127.0.0.1:0")
	require.NoError(t, err)
	require.Equal(t, "tcp", ln.Addr().Network())
	require.NoError(t, ln.Close())
}
