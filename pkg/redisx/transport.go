package redisx

import (
	"bufio"
	"context"
	"crypto/tls"
	"fmt"
	"io"
	"net"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// transportMismatch explains a failed ping of c (err): when the server it
// dials first speaks TLS and c does not (or the reverse), an error wrapping
// ErrAccess that names FLOODGATE_REDIS_TLS; nil otherwise. A client of
// Sentinel is not probed (its master's address comes from the sentinels).
// A wrapper of a client says what it wraps with Unwrap.
func transportMismatch(ctx context.Context, c redis.UniversalClient, err error) error {
	for {
		w, ok := c.(interface{ Unwrap() redis.UniversalClient })
		if !ok {
			break
		}
		c = w.Unwrap()
	}
	var addr string
	var conf *tls.Config
	switch c := c.(type) {
	case *Node:
		if c.mode != "standalone" {
			return nil
		}
		o := c.Options()
		addr, conf = o.Addr, o.TLSConfig
	case *redis.ClusterClient:
		o := c.Options()
		if len(o.Addrs) == 0 {
			return nil
		}
		addr, conf = o.Addrs[0], o.TLSConfig
	default:
		return nil
	}
	if mm := config.ProbeTransport(context.WithoutCancel(ctx), addr, conf, err, respPing, time.Second); mm != nil {
		return fmt.Errorf("%w: %s: %w", ErrAccess, config.RedisTLS().Refusal(mm), mm)
	}
	return nil
}

// respPing sends an inline PING and reports whether the answer is a RESP
// simple string or error (+PONG, -NOAUTH …): a Redis in plaintext.
func respPing(_ context.Context, c net.Conn) bool {
	if _, err := io.WriteString(c, "PING\r\n"); err != nil {
		return false
	}
	b, err := bufio.NewReader(c).ReadByte()
	return err == nil && (b == '+' || b == '-')
}
