package redisx

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/redis/go-redis/v9"
)

// causeWindow is how long a failed dial is taken for the cause of the calls
// that fail after it (unless a dial succeeded since).
const causeWindow = 5 * time.Second

// rootCause is what lies behind err, a call's failure, given f, the latest
// dial when it failed: within causeWindow, the dial's error wrapping the
// call's — a call that waited on a pool that could not dial fails with its
// context's deadline or an EOF, which names a symptom, not the cause
// ("connection refused", "all sentinels are unreachable"). Otherwise err.
func rootCause(f *dialFailure, err error) error {
	if err == nil || f == nil || time.Since(f.at) > causeWindow || strings.Contains(err.Error(), f.err.Error()) {
		return err
	}
	return fmt.Errorf("%w (the call: %w)", f.err, err)
}

// symptom reports an error that says a call did not get through, not why:
// its deadline, a closed connection, no connection free in time.
func symptom(err error) bool {
	var ne net.Error
	return errors.Is(err, context.DeadlineExceeded) || errors.Is(err, io.EOF) || errors.Is(err, io.ErrUnexpectedEOF) ||
		errors.Is(err, redis.ErrPoolTimeout) || errors.As(err, &ne) && ne.Timeout()
}

// clusterCause names the cause in the failed calls of a Redis Cluster: the
// cluster's Dialer records each node's latest failed dial (cleared by one
// that succeeds), and a call that failed with a symptom on a node whose
// latest dial failed returns the dial's error wrapping its own, as a Node's
// RootCause does — so a shard's breaker, which keeps the error that tripped
// it, says "connection refused" when a master died, not "context deadline
// exceeded" (go-redis gives up between its retries, at the cluster, with
// the context's error). The node is the master of the call's first key's
// slot; calls to other masters and Redis's own error replies (CLUSTERDOWN,
// TRYAGAIN…), which name their cause, are left alone. Safe for concurrent use.
type clusterCause struct {
	cc   atomic.Pointer[redis.ClusterClient]
	mu   sync.Mutex
	last map[string]*dialFailure // node address → its latest dial, when it failed
}

func newClusterCause() *clusterCause { return &clusterCause{last: map[string]*dialFailure{}} }

// dialer records the outcome of every dial of dial.
func (c *clusterCause) dialer(dial dialFunc) dialFunc {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		conn, err := dial(ctx, network, addr)
		c.mu.Lock()
		if err != nil {
			c.last[addr] = &dialFailure{err: err, at: time.Now()}
		} else {
			delete(c.last, addr)
		}
		c.mu.Unlock()
		return conn, err
	}
}

func (c *clusterCause) DialHook(next redis.DialHook) redis.DialHook { return next }

func (c *clusterCause) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if w := c.wrap(ctx, cmd, err); w != err { //nolint:errorlint // identity: whether wrap replaced err
			cmd.SetErr(w)
			return w
		}
		return err
	}
}

func (c *clusterCause) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		if err == nil {
			return nil
		}
		var first error
		for _, cmd := range cmds {
			if w := c.wrap(ctx, cmd, cmd.Err()); w != cmd.Err() { //nolint:errorlint // identity: whether wrap replaced it
				cmd.SetErr(w)
				first = cmp.Or(first, w)
			}
		}
		if symptom(err) && first != nil {
			return first
		}
		return err
	}
}

// wrap is err, cmd's failure, with the dial failure of cmd's node behind
// it when err is a symptom.
func (c *clusterCause) wrap(ctx context.Context, cmd redis.Cmder, err error) error {
	if err == nil || !symptom(err) {
		return err
	}
	c.mu.Lock()
	none := len(c.last) == 0
	c.mu.Unlock()
	cc := c.cc.Load()
	key := firstKey(cmd)
	if none || cc == nil || key == "" {
		return err
	}
	m, merr := cc.MasterForKey(ctx, key) // the cached slot map
	if merr != nil {
		return err
	}
	c.mu.Lock()
	f := c.last[m.Options().Addr]
	c.mu.Unlock()
	return rootCause(f, err)
}

// firstKey is cmd's first key: after the key count of EVAL, EVALSHA and
// FCALL (and their _RO forms), else the first argument; "" when it has none.
func firstKey(cmd redis.Cmder) string {
	args := cmd.Args()
	pos := 1
	switch strings.ToLower(cmd.Name()) {
	case "eval", "evalsha", "eval_ro", "evalsha_ro", "fcall", "fcall_ro":
		if len(args) < 4 || fmt.Sprint(args[2]) == "0" {
			return ""
		}
		pos = 3
	}
	if len(args) <= pos {
		return ""
	}
	return fmt.Sprint(args[pos])
}
