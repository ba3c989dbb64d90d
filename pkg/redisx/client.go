package redisx

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/redis/go-redis/v9"
	"github.com/redis/go-redis/v9/maintnotifications"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// Options configure a client. Addrs with more than one entry means Redis
// Cluster; SentinelMaster set means a primary and replicas behind Sentinel,
// found through SentinelAddrs (Addrs is then unused).
type Options struct {
	Addrs        []string
	DialTimeout  time.Duration
	ReadTimeout  time.Duration
	WriteTimeout time.Duration
	PoolSize     int
	// MinIdleConns keeps this many connections dialed ahead (per node), so a
	// first call does not pay a dial — a TLS handshake under load took a
	// limiter's first checks past their 50 ms budget.
	MinIdleConns int

	// SentinelMaster is the master's name in Sentinel (FLOODGATE_REDIS_SENTINEL_MASTER);
	// SentinelAddrs are the sentinels (FLOODGATE_REDIS_SENTINEL_ADDRS).
	SentinelMaster string
	SentinelAddrs  []string

	// Security is AUTH and TLS for every connection (config.ReadRedisSecurity:
	// FLOODGATE_REDIS_USERNAME, FLOODGATE_REDIS_PASSWORD, FLOODGATE_REDIS_TLS…);
	// the zero value is plaintext without AUTH.
	Security config.RedisSecurity

	// Topology, when set, hears of every change of the master in use and
	// logs and counts it (NewTopology); nil: not watched.
	Topology *Topology
}

// dialTimeout is DialTimeout, or go-redis's default when unset; it bounds a
// new connection's HELLO too.
func (o Options) dialTimeout() time.Duration {
	if o.DialTimeout > 0 {
		return o.DialTimeout
	}
	return 5 * time.Second
}

// LogValue is what the options name for a start line (slog.LogValuer): the
// mode and its addresses — Sentinel's master name and the sentinels, a
// Cluster's seed nodes, or the single address — and whether TLS and which
// ACL users are used. Never a password: only whether one is set.
func (o Options) LogValue() slog.Value {
	var attrs []slog.Attr
	switch {
	case o.SentinelMaster != "":
		attrs = append(attrs, slog.String("mode", "sentinel"), slog.String("sentinel_master", o.SentinelMaster),
			slog.Any("sentinels", o.SentinelAddrs))
	case len(o.Addrs) > 1:
		attrs = append(attrs, slog.String("mode", "cluster"), slog.Any("seeds", o.Addrs))
	case len(o.Addrs) == 1:
		attrs = append(attrs, slog.String("mode", "standalone"), slog.String("addr", o.Addrs[0]))
	}
	sec := o.Security
	attrs = append(attrs, slog.Bool("tls", sec.TLS != nil))
	if sec.Username != "" {
		attrs = append(attrs, slog.String("user", sec.Username))
	}
	attrs = append(attrs, slog.Bool("password", sec.Password != ""))
	if o.SentinelMaster != "" {
		if sec.SentinelUsername != "" {
			attrs = append(attrs, slog.String("sentinel_user", sec.SentinelUsername))
		}
		attrs = append(attrs, slog.Bool("sentinel_password", sec.SentinelPassword != ""))
	}
	return slog.GroupValue(attrs...)
}

// noMaint turns off go-redis's maintenance notifications: only Redis
// Enterprise and Cloud serve them, and in its default "auto" mode go-redis
// asks every server once, a round trip on a connection's first command.
func noMaint() *maintnotifications.Config {
	return &maintnotifications.Config{Mode: maintnotifications.ModeDisabled}
}

// protocol is the RESP version every connection speaks: RESP2. Floodgate
// uses no RESP3 feature (no client-side caching, no push notifications:
// maintenance notifications are off, noMaint; no Pub/Sub), and on a RESP3
// connection go-redis peeks for a pending push notification before every
// reply (processPendingPushNotificationWithReader: 1–2.5 % of the limiter's
// CPU in the pinned peerbench, issue 34). go-redis's typed commands and the
// scripts' replies read the same on both.
const protocol = 2

// Validate checks the options; errors name the environment variables.
func (o Options) Validate() error {
	if o.SentinelMaster != "" {
		if len(o.SentinelAddrs) == 0 {
			return errors.New("FLOODGATE_REDIS_SENTINEL_ADDRS: at least one host:port is required with FLOODGATE_REDIS_SENTINEL_MASTER")
		}
		return nil
	}
	if len(o.SentinelAddrs) > 0 {
		return errors.New("FLOODGATE_REDIS_SENTINEL_MASTER: required with FLOODGATE_REDIS_SENTINEL_ADDRS")
	}
	if len(o.Addrs) == 0 {
		return errors.New("FLOODGATE_REDIS_ADDRS: at least one host:port")
	}
	return nil
}

// NewClient returns a cluster client for several addresses, a Sentinel-backed
// failover client when SentinelMaster is set, and a standalone client for one
// address. go-redis routes EVALSHA by the first key's slot, which the hash-tag
// key layout keeps on the principal's slot.
//
// Every connection is ready when it is dialed: the dial sends HELLO (no
// CLIENT SETINFO, no maintenance notifications, which only Redis Enterprise
// serves) and reads its reply (handshakeAhead), so a connection the pool
// dialed ahead costs a command no extra round trip. Pipelines share the main
// pool (PipelinePoolSize -1), which keeps MinIdleConns dialed ahead:
// go-redis's dedicated pipeline pool never dials ahead, so behind a slow
// link a pipeline whose connection had been closed by a timeout dialed a new
// one and paid two handshake round trips inside its budget, timed out in
// turn, and so on (78 dials and 850 degraded answers in
// 10 s at +40 ms, chaos redis-slow). A call's socket is bounded by
// ReadTimeout and WriteTimeout, not by its context's deadline.
//
// A standalone or failover client is a *Node: besides the go-redis client it
// can drop its connections (Reconnect), which the limiter does when a node
// answers READONLY — the node it talks to was demoted, and the next dial asks
// Sentinel where the master is now. Its dials wait for a server that cannot
// be reached instead of failing (redialHook), so the first connection to a
// promoted replica or a restarted server is made at once, not at go-redis's
// once-a-second probe; Close ends the wait. A Cluster client's failed calls
// name their master's failed dial (clusterCause).
func NewClient(o Options) redis.UniversalClient {
	sec := o.Security
	hello := helloCommand(protocol, sec.Username, sec.Password.Reveal())
	if o.SentinelMaster == "" && len(o.Addrs) > 1 {
		cause := newClusterCause()
		cc := redis.NewClusterClient(&redis.ClusterOptions{
			Addrs: o.Addrs, Dialer: cause.dialer(handshakeAhead(defaultDialer(o.dialTimeout(), sec.TLS), hello, o.dialTimeout())),
			DialTimeout: o.DialTimeout, ReadTimeout: o.ReadTimeout,
			WriteTimeout: o.WriteTimeout, PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns, DisableIdentity: true, MaintNotificationsConfig: noMaint(),
			Protocol: protocol, Username: sec.Username, Password: sec.Password.Reveal(), TLSConfig: sec.TLS,
		})
		if o.Topology != nil {
			cc.AddHook(topologyHook{t: o.Topology})
		}
		cause.cc.Store(cc)
		cc.AddHook(cause)
		return cc
	}
	n := &Node{gen: new(atomic.Uint64), topology: o.Topology, readOnlyAt: new(atomic.Int64), dialErr: new(atomic.Pointer[dialFailure]),
		closed: make(chan struct{})}
	if o.SentinelMaster != "" {
		n.Client = redis.NewFailoverClient(&redis.FailoverOptions{
			MasterName: o.SentinelMaster, SentinelAddrs: o.SentinelAddrs,
			Dialer:      defaultDialer(o.dialTimeout(), sec.TLS), // the master's and the sentinels' connect, as go-redis's own
			DialTimeout: poolDialTimeout(o.dialTimeout()), ReadTimeout: o.ReadTimeout, WriteTimeout: o.WriteTimeout, PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns,
			PipelinePoolSize: -1, DisableIdentity: true, Protocol: protocol,
			Username: sec.Username, Password: sec.Password.Reveal(), TLSConfig: sec.TLS,
			SentinelUsername: sec.SentinelUsername, SentinelPassword: sec.SentinelPassword.Reveal(),
		})
		n.mode = "sentinel"
	} else {
		n.Client = redis.NewClient(&redis.Options{
			Addr: o.Addrs[0], Dialer: handshakeAhead(defaultDialer(o.dialTimeout(), sec.TLS), hello, o.dialTimeout()),
			DialTimeout: poolDialTimeout(o.dialTimeout()), ReadTimeout: o.ReadTimeout,
			WriteTimeout: o.WriteTimeout, PoolSize: o.PoolSize, MinIdleConns: o.MinIdleConns,
			PipelinePoolSize: -1, DisableIdentity: true, MaintNotificationsConfig: noMaint(),
			Protocol: protocol, Username: sec.Username, Password: sec.Password.Reveal(), TLSConfig: sec.TLS,
		})
		n.mode = "standalone"
	}
	// Hooks run in the order added, the first outermost: a dial waits for
	// the server around every attempt (redialHook), and each attempt's
	// failure is recorded by topologyHook below it.
	n.AddHook(newRedialHook(redialEvery, n.closed))
	if o.SentinelMaster != "" {
		// Its Dialer also dials the sentinels (with their own credentials):
		// the handshake goes ahead on the master's connections only.
		n.AddHook(readyHook{hello: hello, timeout: o.dialTimeout()})
	}
	n.AddHook(genHook{gen: n.gen})
	via := ViaDial
	if o.SentinelMaster != "" {
		via = ViaSentinel
		if o.Topology != nil {
			o.Topology.mu.Lock()
			o.Topology.name = o.SentinelMaster
			o.Topology.mu.Unlock()
		}
	}
	n.AddHook(topologyHook{t: o.Topology, via: via, readOnlyAt: n.readOnlyAt, dialErr: n.dialErr, node: true, seq: new(atomic.Uint64)})
	return n
}

// Node is a client of one Redis node at a time: standalone, or the master
// Sentinel names. Safe for concurrent use.
type Node struct {
	*redis.Client
	mode       string
	gen        *atomic.Uint64 // connections dialed before the current generation are dropped on their next write
	topology   *Topology
	readOnlyAt *atomic.Int64                // the last Reconnect, unix ns
	dialErr    *atomic.Pointer[dialFailure] // the latest dial, when it failed; nil after one succeeded
	closed     chan struct{}                // closed by Close: dials stop waiting for the server
	closeOnce  sync.Once
}

// Close stops dials waiting for the server, then closes the client.
func (n *Node) Close() error {
	n.closeOnce.Do(func() { close(n.closed) })
	return n.Client.Close()
}

// Mode is "standalone" or "sentinel".
func (n *Node) Mode() string { return n.mode }

// Reconnect retires every open connection: each is closed on its next use and
// the command retried on a new one, which a failover client dials to the
// master Sentinel names now.
func (n *Node) Reconnect() {
	n.readOnlyAt.Store(time.Now().UnixNano())
	n.gen.Add(1)
}

// Master is the address of the server the latest connection reached — the
// master in use — or "" before one did.
func (n *Node) Master() string {
	if n.topology != nil {
		return n.topology.Master()
	}
	return ""
}

// RootCause is what lies behind err, a call's failure: when the latest dial
// failed (within 5 s, and none succeeded since), the dial's error — a call
// that waited on a pool that could not dial fails with its context's
// deadline or an EOF, which names a symptom, not the cause ("connection
// refused", "all sentinels are unreachable"). Otherwise err itself.
func (n *Node) RootCause(err error) error {
	return rootCause(n.dialErr.Load(), err)
}

// errRetired is what a retired connection's write returns. It wraps io.EOF
// so go-redis drops the connection and retries the command (nothing was
// written).
var errRetired = fmt.Errorf("redisx: connection retired after a failover: %w", io.EOF)

type genHook struct{ gen *atomic.Uint64 }

func (h genHook) DialHook(next redis.DialHook) redis.DialHook {
	return func(ctx context.Context, network, addr string) (net.Conn, error) {
		c, err := next(ctx, network, addr)
		if err != nil {
			return nil, err
		}
		return withSyscall(&genConn{Conn: c, gen: h.gen.Load(), cur: h.gen}, c), nil
	}
}

func (genHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (genHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// readyHook moves the handshake of a Node's connections into their dial
// (handshakeAhead).
type readyHook struct {
	hello   []byte
	timeout time.Duration
}

func (h readyHook) DialHook(next redis.DialHook) redis.DialHook {
	return redis.DialHook(handshakeAhead(next, h.hello, h.timeout))
}

func (readyHook) ProcessHook(next redis.ProcessHook) redis.ProcessHook { return next }

func (readyHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// genConn is a connection of one generation.
type genConn struct {
	net.Conn
	gen uint64
	cur *atomic.Uint64
}

func (c *genConn) Write(p []byte) (int, error) {
	if c.cur.Load() != c.gen {
		_ = c.Conn.Close()
		return 0, errRetired
	}
	return c.Conn.Write(p)
}

// IsReadOnly reports a write refused by a replica: the node was demoted (a
// failover, a switchover or a replica promoted by hand).
func IsReadOnly(err error) bool {
	return err != nil && strings.Contains(err.Error(), "READONLY")
}

// Ping checks the client reaches Redis within ctx.
func Ping(ctx context.Context, c redis.UniversalClient) error {
	if err := c.Ping(ctx).Err(); err != nil {
		return fmt.Errorf("ping redis: %w", err)
	}
	return nil
}

// Connect returns a client for o once Redis answers (WaitReady, which logs
// while it waits and returns at once on a refusal waiting cannot fix); when
// it does not, the client is closed and the error returned.
func Connect(ctx context.Context, o Options, log *slog.Logger) (redis.UniversalClient, error) {
	rdb := NewClient(o)
	if err := WaitReady(ctx, rdb, log); err != nil {
		_ = rdb.Close()
		return nil, err
	}
	return rdb, nil
}

// WaitReady pings c until it answers, backing off from 200 ms to 5 s, and
// returns nil then — or ctx's error if ctx ends first. A service that needs
// Redis starts and waits for it instead of exiting while Redis is down or
// failing over (issue 21: a restart loop adds load exactly when Redis
// returns). The first failure is logged, then one line per 30 s with the
// attempts made. A refusal that waiting cannot fix — wrong credentials, a
// certificate that does not verify, TLS against a plaintext port — returns
// at once with an error wrapping ErrAccess that names the variables to fix.
func WaitReady(ctx context.Context, c redis.UniversalClient, log *slog.Logger) error {
	bo := backoff.NewExponentialBackOff()
	bo.InitialInterval, bo.MaxInterval = 200*time.Millisecond, 5*time.Second
	var lastLog time.Time
	for attempt := 1; ; attempt++ {
		pctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		err := Ping(pctx, c)
		cancel()
		if err == nil {
			if attempt > 1 {
				log.Info("redis reachable", "attempts", attempt)
			}
			return nil
		}
		if refused := classifyAccess(err); refused != nil {
			return refused
		}
		if attempt == 1 { // TLS against a plaintext port, or the reverse: asked once
			if mm := transportMismatch(ctx, c, err); mm != nil {
				return mm
			}
		}
		if ctx.Err() != nil {
			return fmt.Errorf("waiting for redis: %w", ctx.Err())
		}
		if time.Since(lastLog) >= 30*time.Second {
			log.Warn("redis unreachable; retrying", "err", err, "attempts", attempt)
			lastLog = time.Now()
		}
		if !tick.Sleep(ctx, bo.NextBackOff()) {
			return fmt.Errorf("waiting for redis: %w", ctx.Err())
		}
	}
}

// CheckAccess pings c and returns an error only when Redis refused the
// client for its configuration (see WaitReady); nil when it answered or could
// not be reached, for callers that do not wait for Redis. A failure that says
// nothing about access is tried twice more at once: with TLS 1.3 a server that
// refuses the client's certificate does so after the client's handshake, and
// the client sees either its alert or, when the close wins the race, a reset.
func CheckAccess(ctx context.Context, c redis.UniversalClient) error {
	var err error
	for range 3 {
		if err = Ping(ctx, c); err == nil {
			return nil
		}
		if refused := classifyAccess(err); refused != nil {
			return refused
		}
		if ctx.Err() != nil {
			break
		}
	}
	return transportMismatch(ctx, c, err) // nil: not reached, which is not refused
}

// ErrAccess marks Redis refusing a client for its configuration: AUTH
// rejected, or TLS that cannot be set up. Retrying does not help.
var ErrAccess = errors.New("redis access refused")

// classifyAccess turns an error that retrying cannot fix into one naming the
// variables behind it, or returns nil. Redis's own messages (WRONGPASS,
// NOAUTH, NOPERM) and crypto/tls's never quote a password.
func classifyAccess(err error) error {
	if why := config.RedisTLS().Refusal(err); why != "" {
		return fmt.Errorf("%w: %s: %w", ErrAccess, why, err)
	}
	msg := err.Error()
	if strings.Contains(msg, "WRONGPASS") || strings.Contains(msg, "NOAUTH") || strings.Contains(msg, "invalid password") ||
		strings.Contains(msg, "AUTH <password> called without any password configured") || strings.Contains(msg, "NOPERM") {
		return fmt.Errorf("%w: authentication failed: check FLOODGATE_REDIS_USERNAME and FLOODGATE_REDIS_PASSWORD (with Sentinel, also FLOODGATE_REDIS_SENTINEL_USERNAME and FLOODGATE_REDIS_SENTINEL_PASSWORD): %w", ErrAccess, err)
	}
	return nil
}
