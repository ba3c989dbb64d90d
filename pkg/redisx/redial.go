package redisx

import (
	"context"
	"errors"
	"net"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// redialEvery is how often a Node tries to connect while its server cannot
// be reached: one attempt for the whole client, however many dials wait.
const redialEvery = 25 * time.Millisecond

// dialPatience is how long one dial of a Node's pool keeps trying before the
// pool counts it failed: longer than Sentinel takes to promote a replica
// after its down-after-milliseconds (30 s by default) in most set-ups.
const dialPatience = 30 * time.Second

// poolDialTimeout is the DialTimeout go-redis's pool gives each of its 5
// attempts of a Node's dial: attempts adding up to dialPatience, since
// redialHook holds an attempt that cannot reach the server until it ends.
// The connect and the handshake keep their own dialTimeout (the Node's
// Dialer), so a host that does not answer is still given up on in time and
// tried again.
func poolDialTimeout(dialTimeout time.Duration) time.Duration {
	return max(dialTimeout, dialPatience/5)
}

// redialHook keeps a Node's dial trying while its server cannot be reached —
// connection refused, no route, a connect timeout, no sentinel answering —
// instead of failing at once, until the dial's context ends. go-redis's pool
// counts failed dials and after PoolSize of them stops dialing: every command
// fails with the last error until a background probe, once a second, gets
// through. A replica Sentinel had promoted, or a restarted server, was then
// used up to a second late (issue 38: answers normal 567–597 ms after the
// promotion). Held here, a dial tries again every redialEvery — one attempt
// at a time for the client, the other dials waiting for its outcome — and
// each attempt asks Sentinel anew (go-redis's failover dialer does on every
// dial), so the first attempt after the promotion connects to the new master.
// Only an outage longer than dialPatience reaches go-redis's count, and so
// its once-a-second probe.
//
// A command waits for its connection until its own context ends, as it
// does for a dial to a host that does not answer; one without a deadline
// waits up to dialPatience. A refusal that waiting cannot fix (AUTH, TLS) is
// returned at once.
type redialHook struct {
	every  time.Duration
	closed <-chan struct{}
	turn   chan struct{} // capacity 1: the attempt in flight while down
	down   *atomic.Bool
	last   *atomic.Pointer[error] // the latest unreachable dial's error
}

func newRedialHook(every time.Duration, closed <-chan struct{}) redialHook {
	return redialHook{every: every, closed: closed, turn: make(chan struct{}, 1),
		down: new(atomic.Bool), last: new(atomic.Pointer[error])}
}

func (h redialHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		for {
			if !h.down.Load() {
				c, err := next(ctx, network, addr)
				if err == nil || !unreachable(err) {
					return c, err
				}
				h.last.Store(&err)
				h.down.Store(true)
			}
			// Down: wait for the turn, then for the interval, then try.
			if !h.wait(ctx, h.turn) {
				return nil, h.err(ctx)
			}
			if !h.down.Load() { // another dial got through
				<-h.turn
				continue
			}
			if !h.pause(ctx) {
				<-h.turn
				return nil, h.err(ctx)
			}
			c, err := next(ctx, network, addr)
			if err == nil || !unreachable(err) {
				h.down.Store(false)
				<-h.turn
				return c, err
			}
			h.last.Store(&err)
			<-h.turn
		}
	}
}

// wait takes the turn, false when ctx ends or the client is closed first.
func (h redialHook) wait(ctx context.Context, turn chan struct{}) bool {
	select {
	case turn <- struct{}{}:
		return true
	case <-ctx.Done():
	case <-h.closed:
	}
	return false
}

// pause waits for the interval, false when ctx ends or the client is closed first.
func (h redialHook) pause(ctx context.Context) bool {
	t := time.NewTimer(h.every)
	defer t.Stop()
	select {
	case <-t.C:
		return true
	case <-ctx.Done():
	case <-h.closed:
	}
	return false
}

// err is what a dial that stopped waiting returns: the latest attempt's
// error, which names the cause ("connection refused"), not the wait's end.
func (h redialHook) err(ctx context.Context) error {
	if p := h.last.Load(); p != nil {
		return *p
	}
	select {
	case <-h.closed:
		return redis.ErrClosed
	default:
		return ctx.Err()
	}
}

func (redialHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (redialHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// unreachable reports a dial that did not reach a server: the connect
// itself failed (refused, no route, timed out), for the master or for every
// sentinel. A server that answered and refused (AUTH, TLS) is not.
func unreachable(err error) bool {
	var op *net.OpError
	return errors.As(err, &op) && op.Op == "dial"
}
