package whatif

import (
	"context"
	"fmt"
	"net/netip"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter"
)

func rules(t testing.TB, name, yaml string) *limiter.Ruleset {
	t.Helper()
	rs, err := limiter.ParseRules(name, []byte(yaml))
	require.NoError(t, err)
	return rs
}

// publish writes decisions to topic, each with its ts as the message time
// (what the limiter's producer does within milliseconds).
func publish(t testing.TB, broker, topic string, ds []events.Decision) {
	t.Helper()
	w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, Balancer: &kafka.Hash{}, RequiredAcks: kafka.RequireAll,
		BatchTimeout: 5 * time.Millisecond, BatchSize: 500}
	defer w.Close()
	msgs := make([]kafka.Message, len(ds))
	for i := range ds {
		v, err := events.EncodeDecision(&ds[i])
		require.NoError(t, err)
		msgs[i] = kafka.Message{Key: []byte(ds[i].Principal.Key()), Value: v, Time: ds[i].TS}
	}
	require.NoError(t, w.WriteMessages(context.Background(), msgs...))
}

func decision(i int, ts time.Time, p events.Principal, ip netip.Addr, method, route string, allowed bool, rule string) events.Decision {
	tier := events.TierPrincipal
	return events.Decision{ID: fmt.Sprintf("d%06d", i), TS: ts, Principal: p, IP: ip, Method: method, Route: route,
		Allowed: allowed, Tier: tier, Cost: 1, Gateway: "test", Rule: rule}
}

func client(broker string) *kafka.Client {
	return &kafka.Client{Addr: kafka.TCP(broker), Timeout: 10 * time.Second}
}
