package chaos

import (
	"errors"
	"fmt"
	"strings"
	"sync"
	"time"

	rlcommon "github.com/envoyproxy/go-control-plane/envoy/extensions/common/ratelimit/v3"
	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"golang.org/x/net/http2/hpack"
	"google.golang.org/grpc/codes"
	"google.golang.org/protobuf/proto"

	"github.com/floodgate-dev/floodgate/loadtest/internal/envoyclient"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/limiter/server"
)

// grpcSenders sends checks as Envoy does: ShouldRateLimit in Floodgate's own
// descriptor shape (one descriptor naming the principal, address, method,
// route and priority), over l.Conns connections, each call with the caller's
// deadline as its gRPC deadline; at the deadline the call is reset and the
// caller stops waiting, and the connection stays.
//
// The connections are envoyclient.Wire, not grpc-go's client: over a
// thousand connections grpc-go's reader and writer goroutines, contexts and
// per-call buffers made this process wait for its own core for tens of
// milliseconds at its 99th percentile, as long as the limiter's waits it is
// there to measure (docs/chaos.md, "a generator that does not stall").
// Each latency runs from the call's write to the read of its last frame.
func (l *Load) grpcSenders() (func(w int) (sender, func()), func(), error) {
	n := l.Conns
	if n <= 0 {
		n = max(l.Workers, 1)
	}
	dialTo := func(addr string) func() (*envoyclient.Wire[*grpcCaller], error) {
		return func() (*envoyclient.Wire[*grpcCaller], error) {
			return envoyclient.DialWire(addr, rlsv3.RateLimitService_ShouldRateLimit_FullMethodName, (*grpcCaller).answered)
		}
	}
	critAddr := l.GRPCAddr
	if l.CriticalAddr != "" {
		critAddr = l.CriticalAddr
	}
	dial, critDial := dialTo(l.GRPCAddr), func() (*envoyclient.Wire[*grpcCaller], error) {
		c, err := dialTo(critAddr)()
		if err == nil {
			c.OnAnswerAfterCancel(l.answeredAfterGivingUp)
		}
		return c, err
	}
	var conns, critConns []*wireSlot
	closeAll := func() {
		for _, c := range append(conns, critConns...) {
			_ = c.get().Close()
		}
	}
	dialAll := func(into *[]*wireSlot, dial func() (*envoyclient.Wire[*grpcCaller], error)) error {
		for range n {
			c, err := dial()
			if err != nil {
				return err
			}
			*into = append(*into, &wireSlot{w: c})
		}
		return nil
	}
	err := dialAll(&conns, dial)
	if err == nil && l.CriticalCluster {
		err = dialAll(&critConns, critDial)
	}
	if err == nil {
		// The phase's clock starts on connections the server has taken: a
		// gateway's are long-lived, and a thousand handshakes in the
		// phase's first second would be measured as the overload's.
		err = settled(append(conns, critConns...), 30*time.Second)
	}
	if err != nil {
		closeAll()
		return nil, nil, err
	}
	var reqs sync.Map // bodyKey → []byte: encoded once, only read after
	request := func(p events.Principal, route, priority string) []byte {
		k := bodyKey{p, priority}
		if r, ok := reqs.Load(k); ok {
			return r.([]byte)
		}
		ip := "198.51.100.23"
		if l.IP != nil {
			ip = l.IP(p)
		}
		entries := []*rlcommon.RateLimitDescriptor_Entry{
			{Key: envoyrls.KeyPrincipalKind, Value: string(p.Kind)}, {Key: envoyrls.KeyPrincipalID, Value: p.ID},
			{Key: envoyrls.KeyRemoteAddress, Value: ip}, {Key: envoyrls.KeyMethod, Value: "GET"}, {Key: envoyrls.KeyRoute, Value: route},
		}
		if priority != "" {
			entries = append(entries, &rlcommon.RateLimitDescriptor_Entry{Key: envoyrls.KeyPriority, Value: priority})
		}
		b, err := proto.Marshal(&rlsv3.RateLimitRequest{Domain: "floodgate", Descriptors: []*rlcommon.RateLimitDescriptor{{Entries: entries}}})
		if err != nil {
			panic(err) // a message of strings always encodes
		}
		reqs.Store(k, b)
		return b
	}
	timeout := 2 * time.Second
	if l.Deadline > 0 {
		timeout = l.Deadline
	}
	// As a gateway's rate-limit cluster for its CRITICAL routes sends it
	// (envoyrls.MetadataPriority).
	critical := []hpack.HeaderField{{Name: envoyrls.MetadataPriority, Value: string(events.PriorityCritical)}}
	// Each connection carries one call before the phase, as a gateway's
	// long-lived connections have: a connection's first call costs the
	// limiter its set-up (buffers, decoder state), which would otherwise be
	// measured as the phase's first second.
	warmUp := events.Principal{Kind: events.PrincipalUser, ID: "warm-up"}
	warm(conns, nil, request(warmUp, "/v1/things", ""))
	warm(critConns, critical, request(warmUp, "/v1/things", string(events.PriorityCritical)))
	return func(w int) (sender, func()) {
		slot, critSlot := conns[w%len(conns)], slotOf(critConns, w)
		g := &grpcCaller{answer: make(chan Check, 1)}
		timer := time.NewTimer(time.Hour)
		timer.Stop()
		return func(p events.Principal, route, priority string) Check {
			g.check = Check{Start: time.Now(), Principal: p, Priority: priority}
			var md []hpack.HeaderField
			slot, redial := slot, dial
			if priority == string(events.PriorityCritical) {
				md = critical
				if critSlot != nil {
					slot, redial = critSlot, critDial
				}
			}
			conn := slot.get()
			id, err := conn.Call(g, timeout, md, request(p, route, priority))
			if err != nil {
				// Not sent: the connection is full (the caller fails open) or
				// gone (dialled again for the next call).
				c := g.check
				c.Latency = time.Since(c.Start)
				if errors.Is(err, envoyclient.ErrClosed) {
					slot.replace(conn, redial)
				}
				return c
			}
			timer.Reset(timeout)
			select {
			case c := <-g.answer:
				timer.Stop()
				return c
			case <-timer.C:
				if _, sent, waiting := conn.Cancel(id); waiting {
					c := g.check
					c.Latency, c.GaveUp = time.Since(sent), true
					return c
				}
				return <-g.answer // being delivered
			}
		}, func() {}
	}, closeAll, nil
}

// warm sends one call over each connection of slots, at most warmInFlight
// at a time, and waits for each answer (or two seconds); the answers are
// not results.
func warm(slots []*wireSlot, md []hpack.HeaderField, body []byte) {
	sem := make(chan struct{}, warmInFlight)
	var wg sync.WaitGroup
	for _, s := range slots {
		sem <- struct{}{}
		wg.Add(1)
		go func() {
			defer func() { <-sem; wg.Done() }()
			g := &grpcCaller{answer: make(chan Check, 1)}
			conn := s.get()
			id, err := conn.Call(g, 2*time.Second, md, body)
			if err != nil {
				return
			}
			select {
			case <-g.answer:
			case <-time.After(2 * time.Second):
				if _, _, waiting := conn.Cancel(id); !waiting {
					<-g.answer // being delivered
				}
			}
		}()
	}
	wg.Wait()
}

// warmInFlight bounds the warm-up's calls in flight: it readies the
// connections without overloading the limiter before the phase.
const warmInFlight = 64

// settled waits until the server has sent its SETTINGS on every
// connection, at most for d.
func settled(slots []*wireSlot, d time.Duration) error {
	t := time.NewTimer(d)
	defer t.Stop()
	for i, s := range slots {
		select {
		case <-s.get().Settled():
		case <-t.C:
			return fmt.Errorf("the server's SETTINGS not read on %d of %d connections within %s", len(slots)-i, len(slots), d)
		}
	}
	return nil
}

// slotOf is worker w's slot of slots, nil when there are none.
func slotOf(slots []*wireSlot, w int) *wireSlot {
	if len(slots) == 0 {
		return nil
	}
	return slots[w%len(slots)]
}

// wireSlot is a connection the workers w, w+n, … share, dialled again when
// the server has closed it (GOAWAY at its maximum connection age).
type wireSlot struct {
	mu sync.Mutex
	w  *envoyclient.Wire[*grpcCaller]
}

func (s *wireSlot) get() *envoyclient.Wire[*grpcCaller] {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.w
}

// replace swaps old for a new connection, unless another worker has.
func (s *wireSlot) replace(old *envoyclient.Wire[*grpcCaller], dial func() (*envoyclient.Wire[*grpcCaller], error)) {
	s.mu.Lock()
	defer s.mu.Unlock()
	if s.w != old {
		return
	}
	if nc, err := dial(); err == nil {
		s.w = nc
		_ = old.Close()
	}
}

// grpcCaller is one worker's call in flight over a Wire: its check, filled
// in by the connection's reader from the answer.
type grpcCaller struct {
	check  Check
	answer chan Check
}

// answered runs on the connection's reader: the check's latency ends here,
// where the answer's last frame is read.
func (g *grpcCaller) answered(a envoyclient.Answer) {
	c := g.check
	c.Latency = a.At.Sub(a.Sent)
	if !a.Arrived.IsZero() {
		c.Arrival = a.Arrived.Sub(a.Sent)
	}
	grpcOutcome(&c, a)
	g.answer <- c
}

// answeredAfterGivingUp keeps the answer to a critical call given up on at
// its deadline (envoyclient.Wire.OnAnswerAfterCancel).
func (l *Load) answeredAfterGivingUp(a envoyclient.Answer) {
	c := Check{Start: a.Sent, Latency: a.At.Sub(a.Sent), Priority: string(events.PriorityCritical), GaveUp: true}
	if !a.Arrived.IsZero() {
		c.Arrival = a.Arrived.Sub(a.Sent)
	}
	grpcOutcome(&c, a)
	l.mu.Lock()
	l.after = append(l.after, c)
	l.mu.Unlock()
}

// grpcOutcome reads a ShouldRateLimit answer into c as the HTTP sender reads
// a /v1/check answer. The limiter's own "past its deadline" status, read
// before the caller's deadline, is an answer (the caller fails open on it):
// OK, degraded and dropped, as the HTTP answer's X-RateLimit-Error is.
func grpcOutcome(c *Check, a envoyclient.Answer) {
	if a.Err != nil {
		return
	}
	switch {
	case a.Code == codes.DeadlineExceeded && a.Message == server.DeadlineReason:
		c.OK, c.Degraded, c.Dropped = true, true, true
		return
	case a.Code == codes.Unavailable && a.Message == envoyrls.Overloaded:
		c.Overloaded = true
		return
	case a.Code != codes.OK:
		return
	}
	resp := &rlsv3.RateLimitResponse{}
	if proto.Unmarshal(a.Body, resp) != nil {
		return
	}
	c.OK = true
	c.Allowed = resp.GetOverallCode() == rlsv3.RateLimitResponse_OK
	for _, h := range resp.GetResponseHeadersToAdd() {
		switch h.GetKey() {
		case "X-Request-Id":
			c.ID = h.GetValue()
		case "X-RateLimit-Error":
			c.Degraded = true
			c.Dropped = strings.Contains(h.GetValue(), "deadline exceeded")
		case "X-RateLimit-Shed":
			c.Degraded, c.Shed = true, true
		case "X-Floodgate-Utilization":
			c.PriorityShed = true
		}
	}
}
