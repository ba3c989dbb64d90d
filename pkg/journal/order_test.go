package journal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"strconv"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

// A key's messages published with TryAppend reach their partition in
// TryAppend's order across the record batcher's start: the broker answers
// no metadata request until the first half ("a-…") were appended (the
// batcher cannot know the partitions), then the second half ("b-…") are
// appended once it has. The broker also holds every produce request that
// carries first-half messages and none of the second half until a
// second-half request has been written (or, none coming, a second after the
// second half was appended): a path that lets a later message leave beside
// an earlier one is caught every time.
// Before issue 34's fix the first half took the async producer's path and
// the second half, sent by the batcher, overtook it
// (TestEmbeddedEngineInAGoGateway in CI); now the batcher holds the first
// half in arrival order and sends them ahead of the second.
func TestTryAppendKeepsKeyOrderAcrossTheBatchersStart(t *testing.T) {
	const topic, partitions, half, keys = "ordered", 3, 300, 5
	c, addr := kafkatest.StartCluster(t, map[string]int32{topic: partitions})
	var open atomic.Bool
	var refused atomic.Int64
	c.ControlKey(kmsg.Metadata.Int16(), func(kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		if open.Load() {
			return nil, nil, false // the broker answers
		}
		refused.Add(1)
		return nil, errors.New("metadata held back by the test"), true // the connection is closed
	})
	// Unix ns: a second-half request arrived; the second half was appended.
	var secondAt, appended atomic.Int64
	c.ControlKey(kmsg.Produce.Int16(), func(req kmsg.Request) (kmsg.Response, error, bool) {
		c.KeepControl()
		var first, second bool
		for _, tp := range req.(*kmsg.ProduceRequest).Topics {
			for _, p := range tp.Partitions {
				first = first || bytes.Contains(p.Records, []byte("a-"))
				second = second || bytes.Contains(p.Records, []byte("b-"))
			}
		}
		if second {
			secondAt.CompareAndSwap(0, time.Now().UnixNano())
		}
		if first && !second {
			c.SleepControl(func() {
				for {
					if at := secondAt.Load(); at != 0 && time.Since(time.Unix(0, at)) > 200*time.Millisecond {
						return // the second-half request was handled
					}
					if at := appended.Load(); at != 0 && time.Since(time.Unix(0, at)) > time.Second {
						return // none came: the second half waits behind this
					}
					time.Sleep(time.Millisecond)
				}
			})
		}
		return nil, nil, false
	})
	d, err := NewDurableProducer(DurableProducerConfig{
		Async: stream.AsyncProducerConfig{Name: "decisions", Brokers: []string{addr}, Topic: topic,
			InitialBackoff: 5 * time.Millisecond, MaxBackoff: 50 * time.Millisecond,
			Logger: streamtest.Logger(t, slog.LevelError), Registerer: prometheus.NewRegistry()},
		Journal: Config{Dir: t.TempDir(), Logger: streamtest.Logger(t, slog.LevelError), Registerer: prometheus.NewRegistry()},
	})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	ran := make(chan error, 1)
	go func() { ran <- d.Run(ctx) }()

	// One caller's buffers, reused for every message as Emit does.
	key, value, id := make([]byte, 0, 16), make([]byte, 0, 16), make([]byte, 0, 16)
	headers := []kafka.Header{{Key: stream.HeaderCEID}}
	appendN := func(from, to int) {
		for i := from; i < to; i++ {
			key = fmt.Appendf(key[:0], "user:%d", i%keys)
			value = strconv.AppendInt(append(value[:0], "ab"[i/half], '-'), int64(i), 10)
			id = strconv.AppendInt(id[:0], int64(i), 10)
			headers[0].Value = id
			require.True(t, d.TryAppend(kafka.Message{Key: key, Value: value, Headers: headers}), "message %d", i)
		}
	}
	require.Eventually(t, func() bool { return refused.Load() > 0 }, 10*time.Second, time.Millisecond, "the batcher asks for the partitions")
	appendN(0, half)
	require.False(t, d.batch.Ready(), "no partitions without metadata")
	open.Store(true)
	require.Eventually(t, d.batch.Ready, 10*time.Second, time.Millisecond)
	appendN(half, 2*half)
	appended.Store(time.Now().UnixNano())

	var got int64
	require.Eventually(t, func() bool {
		got = 0
		for _, o := range kafkatest.EndOffsets(t, addr, topic, partitions) {
			got += o
		}
		return got >= 2*half
	}, 20*time.Second, 10*time.Millisecond, "every message on the topic")
	cancel()
	stacktest.Returned(t, ran, 10*time.Second, "Run returns after its context ended")

	seen := map[int]bool{}
	for p, end := range kafkatest.EndOffsets(t, addr, topic, partitions) {
		last := map[string]int{}
		for _, m := range kafkatest.ReadPartition(t, addr, topic, p, int(end)) {
			i, err := strconv.Atoi(string(m.Value[2:]))
			require.NoError(t, err)
			require.False(t, seen[i], "message %d twice", i)
			seen[i] = true
			if prev, ok := last[string(m.Key)]; ok {
				require.Less(t, prev, i, "key %s: message %d after %d on partition %d", m.Key, i, prev, p)
			}
			last[string(m.Key)] = i
		}
	}
	require.Len(t, seen, 2*half)
}
