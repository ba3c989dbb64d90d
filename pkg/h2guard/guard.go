// Package h2guard bounds what one HTTP/2 connection may do with stream
// resets (CVE-2023-44487, "rapid reset": open a stream, reset it at once,
// repeat — the server starts work for every stream and the client pays
// nothing). A server's own limit on concurrent streams does not help: reset
// streams are not concurrent. The guard reads the frames a client sends and
// spends a per-connection budget on each RST_STREAM; a connection past its
// budget whose resets are at least half of the streams it opened is sent
// GOAWAY (ENHANCE_YOUR_CALM) and closed, and counted; its address's new
// connections are then closed at accept for a cool-down. Envoy's
// premature-reset limit and Go's own HTTP/2 server (which caps handlers and
// their queue, then sends GOAWAY) bound the same attack.
//
// It sits under the HTTP/2 server as a connection wrapper: for gRPC as
// transport credentials (Credentials) that wrap any other's connections.
package h2guard

import (
	"context"
	"encoding/binary"
	"errors"
	"io"
	"net"
	"sort"
	"sync"
	"sync/atomic"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/prometheus/client_golang/prometheus"
	"google.golang.org/grpc/credentials"
)

// Config bounds one connection. The zero value takes the defaults.
type Config struct {
	// ResetBurst and ResetRate are the reset budget of a connection: a token
	// bucket holding ResetBurst resets, refilled at ResetRate per second
	// (defaults 200 and 100/s). Cancelled calls are normal — Envoy resets a
	// call it stopped waiting for — so a connection is only judged once its
	// budget is spent, and only abusive when at least half of its streams
	// were reset.
	ResetBurst int
	ResetRate  float64
	// MinLifetime: a stream reset at least this long after the client opened
	// it is a caller that stopped waiting (its deadline passed while the
	// server was busy) and spends no budget (default 10 ms; Envoy's premature
	// reset is the same idea). A rapid reset resets a stream at once — in the
	// same packet that opened it — so the server starts work the client never
	// waits for; a caller that waited holds its stream like any other call,
	// bounded by the server's concurrent streams. Without it an overloaded
	// server took its callers' timeouts for an attack and closed and banned
	// their address: the overload scenario (loadtest/chaos, 50 ms deadlines)
	// saw 55 connections sent GOAWAY within 4 s.
	MinLifetime time.Duration
	// GoawayGrace bounds how long the guard waits for the server's writer to
	// finish a frame before it closes without a GOAWAY (default 100 ms).
	GoawayGrace time.Duration
	// Cooldown is how long the address of a connection closed for abuse has
	// its new connections closed at once, before any HTTP/2 is spoken
	// (default 10 s): a client that reconnects to flood again costs the
	// server an accept and a close.
	Cooldown time.Duration
	// Tarpit is how long such a connection is held, silent, before it is
	// closed (default 1 s), so that a client reconnecting in a loop makes a
	// few attempts a second, not thousands; at most MaxTarpitted (default
	// 64) are held at once, the rest closed at once.
	Tarpit       time.Duration
	MaxTarpitted int
	Now          func() time.Time
}

// Guard wraps connections; safe for concurrent use.
type Guard struct {
	cfg     Config
	epoch   time.Time // what the streams' opening times count from
	resets  prometheus.Counter
	goaways prometheus.Counter
	cooling prometheus.Counter

	mu     sync.Mutex
	banned map[string]time.Time // client address → end of its cool-down
	pit    chan struct{}        // a slot per connection held in the tarpit
}

// New returns a guard counting into <namespace>_stream_resets_total and
// <namespace>_abuse_goaways_total on reg (nil: not registered). Registering
// twice on one registry shares the counters.
func New(cfg Config, reg prometheus.Registerer, namespace string) *Guard {
	config.Default(&cfg.ResetBurst, 200)
	config.Default(&cfg.ResetRate, 100)
	config.Default(&cfg.MinLifetime, 10*time.Millisecond)
	config.Default(&cfg.GoawayGrace, 100*time.Millisecond)
	config.Default(&cfg.Cooldown, 10*time.Second)
	config.Default(&cfg.Tarpit, time.Second)
	config.Default(&cfg.MaxTarpitted, 64)
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	return &Guard{cfg: cfg, epoch: cfg.Now(), banned: map[string]time.Time{}, pit: make(chan struct{}, cfg.MaxTarpitted),
		cooling: register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: namespace + "_abuse_refused_connections_total",
			Help: "HTTP/2 connections closed at accept because their address was closed for abuse within the cool-down."})),
		resets: register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: namespace + "_stream_resets_total",
			Help: "HTTP/2 streams the client reset (RST_STREAM), every connection."})),
		goaways: register(reg, prometheus.NewCounter(prometheus.CounterOpts{Name: namespace + "_abuse_goaways_total",
			Help: "HTTP/2 connections sent GOAWAY (ENHANCE_YOUR_CALM) and closed for resetting streams past their budget (rapid reset, CVE-2023-44487)."})),
	}
}

func register(reg prometheus.Registerer, c prometheus.Counter) prometheus.Counter {
	if reg == nil {
		return c
	}
	if err := reg.Register(c); err != nil {
		var are prometheus.AlreadyRegisteredError
		if errors.As(err, &are) {
			if existing, ok := are.ExistingCollector.(prometheus.Counter); ok {
				return existing
			}
		}
	}
	return c
}

// Admit reports whether a new connection from remote may be served: false
// while its address cools down after a connection closed for abuse.
func (g *Guard) Admit(remote net.Addr) bool {
	host, ok := banKey(remote)
	if !ok {
		return true // nothing to have banned
	}
	g.mu.Lock()
	defer g.mu.Unlock()
	until, ok := g.banned[host]
	if !ok {
		return true
	}
	if g.cfg.Now().Before(until) {
		g.cooling.Inc()
		return false
	}
	delete(g.banned, host)
	return true
}

// ban starts remote's cool-down, dropping the cool-downs that ended.
func (g *Guard) ban(remote net.Addr) {
	host, ok := banKey(remote)
	if !ok {
		return
	}
	now := g.cfg.Now()
	g.mu.Lock()
	defer g.mu.Unlock()
	for h, until := range g.banned {
		if !now.Before(until) {
			delete(g.banned, h)
		}
	}
	g.banned[host] = now.Add(g.cfg.Cooldown)
}

// refuse closes a connection of an address that is cooling down, after
// holding it in the tarpit when there is room.
func (g *Guard) refuse(c net.Conn) {
	select {
	case g.pit <- struct{}{}:
		time.Sleep(g.cfg.Tarpit)
		<-g.pit
	default:
	}
	_ = c.Close()
}

// banKey is what a connection from a is banned by: its host (an IP). ok is
// false for an address that is not a TCP one, a unix socket's peer above
// all, which every client of the socket shares: a connection from it is
// closed for abuse all the same, and no one is banned.
func banKey(a net.Addr) (string, bool) {
	if a == nil || (a.Network() != "tcp" && a.Network() != "tcp4" && a.Network() != "tcp6") {
		return "", false
	}
	if h, _, err := net.SplitHostPort(a.String()); err == nil {
		return h, true
	}
	return a.String(), true
}

// ErrCooling refuses a connection whose address is cooling down.
var ErrCooling = errors.New("h2guard: connection refused: the address was closed for abuse and is cooling down")

// ErrAbuse is the error the server reads from a connection the guard closed.
var ErrAbuse = errors.New("h2guard: connection closed: too many stream resets")

// HTTP/2 frame types and the error code the guard uses (RFC 9113).
const (
	frameHeaders    = 0x1
	frameRSTStream  = 0x3
	frameGoAway     = 0x7
	enhanceYourCalm = 0xb
	clientPreface   = "PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
)

// Conn wraps a server-side connection whose first bytes from the client are
// the HTTP/2 preface.
func (g *Guard) Conn(c net.Conn) net.Conn {
	return &conn{Conn: c, g: g, in: parser{preface: len(clientPreface)}, tokens: float64(g.cfg.ResetBurst),
		last: g.cfg.Now(), sent: make(chan struct{})}
}

type conn struct {
	net.Conn
	g *Guard

	// read side (the server's single reader goroutine)
	in        parser
	tokens    float64
	last      time.Time
	streams   int64
	resets    int64
	maxStream uint32
	opened    []opened // the newest streams opened (grown to openRing, then oldest overwritten)
	nOpened   int

	wmu     sync.Mutex // the server's writes, and the GOAWAY between two frames
	out     parser
	pending []byte // a GOAWAY waiting for the writer to finish its frame
	done    bool   // GOAWAY sent (or given up on): nothing more is written
	sent    chan struct{}
	aborted atomic.Bool // closed for abuse: the guard closes it when drained
}

// openRing is how many of a connection's newest streams the guard keeps the
// opening time of (about MaxGRPCStreams).
const openRing = 1024

// opened is a stream's id and when it was opened, in nanoseconds since the
// guard's epoch: no pointer (a time.Time holds one), so a server's thousands
// of rings are memory the garbage collector never scans — as time.Time
// they were 32 KiB of pointers a connection, 64 MiB over the overload
// scenario's 2,048, scanned at every cycle.
type opened struct {
	id uint32
	at int64
}

// openedAt is when stream id was opened, or, for a stream older than the
// ring, the newest time it may have been opened (the ring's oldest entry).
func (c *conn) openedAt(id uint32) time.Time {
	n := min(c.nOpened, openRing)
	first := 0
	if c.nOpened > openRing {
		first = c.nOpened % openRing
	}
	at := func(i int) *opened { return &c.opened[(first+i)%openRing] }
	i := sort.Search(n, func(i int) bool { return at(i).id >= id })
	switch {
	case n == 0:
		return c.g.cfg.Now()
	case i < n && at(i).id == id:
		return c.g.epoch.Add(time.Duration(at(i).at))
	case i == 0:
		return c.g.epoch.Add(time.Duration(at(0).at))
	}
	return c.g.cfg.Now() // never opened (a reset of an idle stream): premature
}

// Read passes the client's bytes on, judging its frames as they go by.
func (c *conn) Read(p []byte) (int, error) {
	n, err := c.Conn.Read(p)
	if n > 0 && c.in.feed(p[:n], c.frame) {
		c.abort()
		return 0, ErrAbuse
	}
	return n, err
}

// frame judges one client frame header; true means abuse.
func (c *conn) frame(typ byte, stream uint32) bool {
	switch typ {
	case frameHeaders:
		if stream > c.maxStream {
			c.maxStream = stream
			c.streams++
			o := opened{id: stream, at: int64(c.g.cfg.Now().Sub(c.g.epoch))}
			if len(c.opened) < openRing {
				c.opened = append(c.opened, o)
			} else {
				c.opened[c.nOpened%openRing] = o
			}
			c.nOpened++
		}
	case frameRSTStream:
		c.g.resets.Inc()
		now := c.g.cfg.Now()
		if now.Sub(c.openedAt(stream)) >= c.g.cfg.MinLifetime {
			return false // a caller that waited, then gave up
		}
		c.resets++
		c.tokens = min(float64(c.g.cfg.ResetBurst), c.tokens+now.Sub(c.last).Seconds()*c.g.cfg.ResetRate)
		c.last = now
		if c.tokens >= 1 {
			c.tokens--
			return false
		}
		return 2*c.resets >= c.streams
	}
	return false
}

// abort sends GOAWAY(ENHANCE_YOUR_CALM) between two of the server's frames
// (at once, or when its writer finishes the frame it is in, within
// GoawayGrace) and closes the connection.
func (c *conn) abort() {
	c.g.goaways.Inc()
	c.g.ban(c.Conn.RemoteAddr())
	f := make([]byte, 9+8+len("too_many_resets"))
	binary.BigEndian.PutUint32(f[0:4], uint32(len(f)-9)<<8) // 24-bit length, then the type byte
	f[3] = frameGoAway
	binary.BigEndian.PutUint32(f[9:13], c.maxStream)
	binary.BigEndian.PutUint32(f[13:17], enhanceYourCalm)
	copy(f[17:], "too_many_resets")
	// A write blocked on a client that does not read gives up in time.
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.g.cfg.GoawayGrace))
	c.wmu.Lock()
	if !c.done {
		if c.out.boundary() {
			c.sendLocked(f)
		} else {
			c.pending = f
		}
	}
	c.wmu.Unlock()
	select {
	case <-c.sent:
	case <-time.After(c.g.cfg.GoawayGrace):
	}
	// Closing with the client's frames unread would reset the connection and
	// could discard the GOAWAY before the client reads it: half-close, and
	// drain (at most a second) before the close.
	c.aborted.Store(true)
	if cw, ok := c.Conn.(interface{ CloseWrite() error }); ok {
		_ = cw.CloseWrite()
	}
	go func() {
		_ = c.Conn.SetReadDeadline(time.Now().Add(time.Second))
		_, _ = io.Copy(io.Discard, c.Conn)
		_ = c.Conn.Close()
	}()
}

// Close closes the connection, unless the guard closes it after a GOAWAY.
func (c *conn) Close() error {
	if c.aborted.Load() {
		return nil
	}
	return c.Conn.Close()
}

func (c *conn) sendLocked(f []byte) {
	_ = c.Conn.SetWriteDeadline(time.Now().Add(c.g.cfg.GoawayGrace))
	_, _ = c.Conn.Write(f)
	c.done, c.pending = true, nil
	close(c.sent)
}

// Write passes the server's bytes on, keeping track of its frames so that a
// GOAWAY never lands inside one.
func (c *conn) Write(p []byte) (int, error) {
	c.wmu.Lock()
	defer c.wmu.Unlock()
	if c.done {
		return 0, ErrAbuse
	}
	n, err := c.Conn.Write(p)
	c.out.feed(p[:n], nil)
	if c.pending != nil && c.out.boundary() {
		c.sendLocked(c.pending)
	}
	return n, err
}

// parser follows HTTP/2 frame boundaries in a byte stream.
type parser struct {
	preface int // bytes of the client preface still to pass
	hdr     [9]byte
	nh      int // header bytes held
	left    int // payload bytes of the current frame still to pass
}

// feed consumes b, calling on (when set) for every frame header; it stops
// and reports true when on does.
func (p *parser) feed(b []byte, on func(typ byte, stream uint32) bool) bool {
	for len(b) > 0 {
		switch {
		case p.preface > 0:
			k := min(p.preface, len(b))
			p.preface -= k
			b = b[k:]
		case p.left > 0:
			k := min(p.left, len(b))
			p.left -= k
			b = b[k:]
		default:
			k := copy(p.hdr[p.nh:], b)
			p.nh += k
			b = b[k:]
			if p.nh < len(p.hdr) {
				return false
			}
			p.nh = 0
			p.left = int(p.hdr[0])<<16 | int(p.hdr[1])<<8 | int(p.hdr[2])
			if on != nil && on(p.hdr[3], binary.BigEndian.Uint32(p.hdr[5:9])&0x7fffffff) {
				return true
			}
		}
	}
	return false
}

func (p *parser) boundary() bool { return p.preface == 0 && p.nh == 0 && p.left == 0 }

// Credentials wraps inner (insecure.NewCredentials() for plaintext) so that
// every connection a gRPC server accepts is guarded.
func Credentials(inner credentials.TransportCredentials, g *Guard) credentials.TransportCredentials {
	return &creds{TransportCredentials: inner, g: g}
}

type creds struct {
	credentials.TransportCredentials
	g *Guard
}

func (c *creds) ServerHandshake(raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	if !c.g.Admit(raw.RemoteAddr()) {
		c.g.refuse(raw)
		return nil, nil, ErrCooling
	}
	conn, info, err := c.TransportCredentials.ServerHandshake(raw)
	if err != nil {
		return nil, nil, err
	}
	return c.g.Conn(conn), info, nil
}

func (c *creds) ClientHandshake(ctx context.Context, authority string, raw net.Conn) (net.Conn, credentials.AuthInfo, error) {
	return c.TransportCredentials.ClientHandshake(ctx, authority, raw)
}

func (c *creds) Clone() credentials.TransportCredentials {
	return &creds{TransportCredentials: c.TransportCredentials.Clone(), g: c.g}
}
