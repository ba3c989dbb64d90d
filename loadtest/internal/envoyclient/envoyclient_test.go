package envoyclient

import (
	"bytes"
	"context"
	"io"
	"net"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials/insecure"
	"google.golang.org/protobuf/types/known/emptypb"
)

// pingCounter is an HTTP/2 server by hand: it answers every unary call
// with an empty message and counts the PINGs its client sends.
func pingCounter(t *testing.T) (string, *atomic.Int64) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	t.Cleanup(func() { _ = ln.Close() })
	var pings atomic.Int64
	go func() {
		nc, err := ln.Accept()
		if err != nil {
			return
		}
		defer nc.Close()
		if _, err := io.ReadFull(nc, make([]byte, len(http2.ClientPreface))); err != nil {
			return
		}
		fr := http2.NewFramer(nc, nc)
		fr.ReadMetaHeaders = hpack.NewDecoder(4096, nil)
		var hb bytes.Buffer
		enc := hpack.NewEncoder(&hb)
		block := func(kv ...string) []byte {
			hb.Reset()
			for i := 0; i < len(kv); i += 2 {
				_ = enc.WriteField(hpack.HeaderField{Name: kv[i], Value: kv[i+1]})
			}
			return bytes.Clone(hb.Bytes())
		}
		_ = fr.WriteSettings()
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				return
			}
			switch f := f.(type) {
			case *http2.SettingsFrame:
				if !f.IsAck() {
					_ = fr.WriteSettingsAck()
				}
			case *http2.PingFrame:
				if !f.IsAck() {
					pings.Add(1)
					_ = fr.WritePing(true, f.Data)
				}
			case *http2.DataFrame:
				if f.StreamEnded() {
					id := f.StreamID
					_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true,
						BlockFragment: block(":status", "200", "content-type", "application/grpc")})
					_ = fr.WriteData(id, false, []byte{0, 0, 0, 0, 0})
					_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, EndHeaders: true, EndStream: true,
						BlockFragment: block("grpc-status", "0")})
				}
			}
		}
	}()
	return ln.Addr().String(), &pings
}

// calls makes n unary calls on c, one after another, and returns the PINGs
// the server saw once they are answered.
func calls(t *testing.T, c *grpc.ClientConn, pings *atomic.Int64, n int) int64 {
	t.Cleanup(func() { _ = c.Close() })
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for range n {
		require.NoError(t, c.Invoke(ctx, "/x.Y/Z", &emptypb.Empty{}, &emptypb.Empty{}))
	}
	time.Sleep(100 * time.Millisecond) // a ping the last answer set off
	return pings.Load()
}

// grpc-go's own client pings the server after answers (its bandwidth-delay
// estimator); a connection from Dial, like Envoy's, does not.
func TestNoPingPerAnswer(t *testing.T) {
	addr, pings := pingCounter(t)
	plain, err := grpc.NewClient(addr, grpc.WithTransportCredentials(insecure.NewCredentials()))
	require.NoError(t, err)
	require.Greater(t, calls(t, plain, pings, 20), int64(5), "grpc-go's default client pings as answers come")

	addr, pings = pingCounter(t)
	c, err := Dial(addr)
	require.NoError(t, err)
	require.Zero(t, calls(t, c, pings, 20), "no PING from a static-window client")
}
