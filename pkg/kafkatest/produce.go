package kafkatest

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// ProduceDecisions writes ds onto topic of the broker at addr in batches of
// 5,000, each message keyed by its principal and stamped with its decision's
// time, as the limiter's producer does. It fails the test on any error.
func ProduceDecisions(t testing.TB, ctx context.Context, addr, topic string, ds []events.Decision) {
	t.Helper()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DefaultProduceTopic(topic), kgo.ProducerLinger(5*time.Millisecond))
	require.NoError(t, err)
	defer cl.Close()
	batch := make([]*kgo.Record, 0, 5000)
	flush := func() {
		require.NoError(t, cl.ProduceSync(ctx, batch...).FirstErr())
		batch = batch[:0]
	}
	for i := range ds {
		b, err := events.EncodeDecision(&ds[i])
		require.NoError(t, err)
		if batch = append(batch, &kgo.Record{Key: []byte(ds[i].Principal.Key()), Value: b, Timestamp: ds[i].TS}); len(batch) == cap(batch) {
			flush()
		}
	}
	flush()
}
