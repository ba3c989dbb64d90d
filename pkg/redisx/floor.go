package redisx

import (
	"context"
	"errors"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// RoundTripFloor is the shortest round trip of a client's commands and
// pipelines of late (the last one or two of its buckets): the least Redis
// and the network to it add to every call, which no queueing in the client
// can shorten. A limit that steers a latency which includes Redis's round
// trip (the gRPC entry gate) adds it to its target, so that a slower Redis
// raises the target instead of shrinking the limit, while the client's own
// queueing, which lengthens some round trips but not the shortest, still
// shrinks it. It is a go-redis hook (AddHook); recording costs two clock
// reads and two atomic loads (a compare-and-swap when a new shortest
// comes). Safe for concurrent use.
type RoundTripFloor struct {
	bucket time.Duration
	start  time.Time
	turnAt func() time.Time // Floor's clock: time.Now; tests move it
	at     atomic.Int64     // the current bucket's number
	// the shortest round trip of the current and the previous bucket, ns;
	// 0: none recorded
	cur, prev atomic.Int64
}

// DefaultFloorBucket is the length of a RoundTripFloor's buckets: a step in
// Redis's round trip shows in the floor within two of them.
const DefaultFloorBucket = 250 * time.Millisecond

// NewRoundTripFloor returns a floor over buckets of bucket (0:
// DefaultFloorBucket).
func NewRoundTripFloor(bucket time.Duration) *RoundTripFloor {
	if bucket <= 0 {
		bucket = DefaultFloorBucket
	}
	return &RoundTripFloor{bucket: bucket, start: time.Now(), turnAt: time.Now}
}

var _ redis.Hook = (*RoundTripFloor)(nil)

// turn moves to the bucket of now (ns since start), never back.
func (f *RoundTripFloor) turn(now int64) {
	n := now / int64(f.bucket)
	at := f.at.Load()
	if n <= at || !f.at.CompareAndSwap(at, n) {
		return // current (or a late record's), or another goroutine turned it
	}
	cur := f.cur.Swap(0)
	if n != at+1 {
		cur = 0 // a whole bucket passed with nothing recorded
	}
	f.prev.Store(cur)
}

// Record adds one round trip that ended at end.
func (f *RoundTripFloor) Record(end time.Time, d time.Duration) {
	f.turn(int64(end.Sub(f.start)))
	ns := max(int64(d), 1)
	for {
		old := f.cur.Load()
		if old != 0 && old <= ns || f.cur.CompareAndSwap(old, ns) {
			return
		}
	}
}

// Floor is the shortest round trip recorded in the current bucket and the
// one before it; 0 when none was.
func (f *RoundTripFloor) Floor() time.Duration {
	f.turn(int64(f.turnAt().Sub(f.start)))
	cur, prev := f.cur.Load(), f.prev.Load()
	switch {
	case cur == 0:
		return time.Duration(prev)
	case prev == 0:
		return time.Duration(cur)
	}
	return time.Duration(min(cur, prev))
}

// answered reports whether err is Redis's answer (a reply, redis.Nil or an
// error reply), not a failure to get one: only an answer's round trip is
// Redis's.
func answered(err error) bool {
	var reply redis.Error
	return err == nil || errors.As(err, &reply) // redis.Nil is one
}

// handshake reports whether cmd opens a connection: a connection dialed
// ahead has its HELLO answered in the dial (handshakeAhead), so go-redis's
// own comes back at once, without a round trip.
func handshake(cmd redis.Cmder) bool {
	switch cmd.Name() {
	case "hello", "auth", "client", "select":
		return true
	}
	return false
}

func (f *RoundTripFloor) DialHook(next redis.DialHook) redis.DialHook { return next }

func (f *RoundTripFloor) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmd)
		if answered(err) && !handshake(cmd) {
			end := time.Now()
			f.Record(end, end.Sub(start))
		}
		return err
	}
}

func (f *RoundTripFloor) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		start := time.Now()
		err := next(ctx, cmds)
		if answered(err) && (len(cmds) == 0 || !handshake(cmds[0])) {
			end := time.Now()
			f.Record(end, end.Sub(start))
		}
		return err
	}
}
