package redistest

import (
	"fmt"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"
)

// Proxy is a TCP proxy on a loopback port in front of a Redis node, for
// fault tests: it adds latency to every reply (Delay), stalls every
// connection for a while (Stall), and can be pointed at another upstream
// (SetUpstream) — new connections go there, open ones stay where they were,
// as behind a virtual IP that moved. Safe for concurrent use.
type Proxy struct {
	Addr string

	ln       net.Listener
	upstream atomic.Pointer[string]
	delay    atomic.Int64 // ns added before each chunk is passed on
	stallTo  atomic.Int64 // unix ns: nothing passes before this
	mu       sync.Mutex
	conns    map[net.Conn]struct{}
	closed   atomic.Bool
	accepted atomic.Int64
	late     atomic.Int64 // replies passed on more than LateBy after their delay ended
	lateMax  atomic.Int64 // ns: the latest of them
	slow     atomic.Int64 // replies that came from upstream more than LateBy after the request before them
	slowMax  atomic.Int64 // ns: the slowest of them
	wg       sync.WaitGroup
}

// LateBy is how far past its delay a reply may be passed on before Late
// counts it: the proxy's own scheduling, which a fault test would otherwise
// charge to the code it measures.
const LateBy = 2 * time.Millisecond

// StartProxy listens on a free loopback port and forwards to upstream.
func StartProxy(upstream string) (*Proxy, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return nil, fmt.Errorf("proxy listen: %w", err)
	}
	p := &Proxy{Addr: ln.Addr().String(), ln: ln, conns: map[net.Conn]struct{}{}}
	p.upstream.Store(&upstream)
	p.wg.Add(1)
	go p.accept()
	return p, nil
}

// NewProxy is StartProxy for a test, closed when the test ends.
func NewProxy(t testing.TB, upstream string) *Proxy {
	t.Helper()
	p, err := StartProxy(upstream)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(p.Close)
	return p
}

// SetDelay adds d to every reply from now on (0 removes it).
func (p *Proxy) SetDelay(d time.Duration) { p.delay.Store(int64(d)) }

// Late reports how many delayed replies were passed on more than LateBy
// after their delay ended, and the latest by how much.
func (p *Proxy) Late() (n int64, most time.Duration) {
	return p.late.Load(), time.Duration(p.lateMax.Load())
}

// Upstream reports how many replies came from upstream more than LateBy
// after the request passed on before them (Redis's own time, its wait for a
// CPU included: what the proxy's delay is added to), and the slowest.
func (p *Proxy) Upstream() (n int64, most time.Duration) {
	return p.slow.Load(), time.Duration(p.slowMax.Load())
}

// Stall holds every byte in both directions for d from now.
func (p *Proxy) Stall(d time.Duration) { p.stallTo.Store(time.Now().Add(d).UnixNano()) }

// Accepted counts the client connections the proxy has accepted so far: a
// client that dials during a fault pays the fault on its handshake too.
func (p *Proxy) Accepted() int64 { return p.accepted.Load() }

// SetUpstream sends new connections to addr.
func (p *Proxy) SetUpstream(addr string) { p.upstream.Store(&addr) }

// Close stops listening and closes every connection.
func (p *Proxy) Close() {
	if p.closed.Swap(true) {
		return
	}
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

func (p *Proxy) track(c net.Conn, on bool) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if on {
		if p.closed.Load() {
			return false
		}
		p.conns[c] = struct{}{}
	} else {
		delete(p.conns, c)
	}
	return true
}

func (p *Proxy) accept() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		p.accepted.Add(1)
		up, err := net.DialTimeout("tcp", *p.upstream.Load(), time.Second)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c, true) || !p.track(up, true) {
			_ = c.Close()
			_ = up.Close()
			return
		}
		p.wg.Add(2)
		sent := new(atomic.Int64) // unix ns: the last request chunk passed upstream
		go p.pipe(up, c, false, sent)
		go p.pipe(c, up, true, sent)
	}
}

// pipe copies src to dst; replies (upstream → client) are each held for
// the delay after they arrived (a link with latency, not a slow one: chunks
// in flight do not add up), and a stall holds everything until it ends.
func (p *Proxy) pipe(dst, src net.Conn, reply bool, sent *atomic.Int64) {
	defer p.wg.Done()
	type chunk struct {
		b  []byte
		at time.Time
	}
	q := make(chan chunk, 1024)
	go func() {
		defer close(q)
		for {
			buf := make([]byte, 32<<10)
			n, err := src.Read(buf)
			if n > 0 {
				q <- chunk{buf[:n], time.Now()}
			}
			if err != nil {
				return
			}
		}
	}()
	defer func() {
		_ = src.Close()
		_ = dst.Close()
		p.track(src, false)
		p.track(dst, false)
		for range q { // let the reader finish
		}
	}()
	for c := range q {
		if at := sent.Swap(0); reply && at > 0 {
			if took := c.at.Sub(time.Unix(0, at)); took > LateBy {
				p.slow.Add(1)
				storeMax(&p.slowMax, int64(took))
			}
		}
		if d := time.Duration(p.delay.Load()); reply && d > 0 {
			due := c.at.Add(d)
			time.Sleep(time.Until(due))
			if late := time.Since(due); late > LateBy {
				p.late.Add(1)
				storeMax(&p.lateMax, int64(late))
			}
		}
		if until := p.stallTo.Load(); until > 0 {
			time.Sleep(time.Until(time.Unix(0, until)))
		}
		if !reply {
			sent.Store(time.Now().UnixNano())
		}
		if _, err := dst.Write(c.b); err != nil {
			return
		}
	}
}

// storeMax raises m to v.
func storeMax(m *atomic.Int64, v int64) {
	for cur := m.Load(); v > cur && !m.CompareAndSwap(cur, v); cur = m.Load() {
	}
}
