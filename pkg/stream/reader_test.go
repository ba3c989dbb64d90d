package stream

import (
	"context"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kgo"

	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

// endOnFirstPoll ends a context the first time a poll takes records out of
// the client's buffer, on the polling goroutine, before the poll returns.
type endOnFirstPoll struct {
	once sync.Once
	end  context.CancelFunc
}

func (h *endOnFirstPoll) OnFetchRecordUnbuffered(_ *kgo.Record, polled bool) {
	if polled {
		h.once.Do(h.end)
	}
}

// TestPartitionReaderKeepsRecordsPolledAsItsContextEnds: FetchMessage's
// context can end after the client handed it records and before it looks at
// the context — a batch's linger deadline, or a revoke, landing then; on a
// loaded machine the fetching goroutine is descheduled in that window. The
// client's position has moved past those records, so the reader must still
// return them, in order: dropped, the partition went on after them and the
// consumer committed past messages nobody handled (the quota ledger lost
// their units: BenchmarkLedger/steady under load).
func TestPartitionReaderKeepsRecordsPolledAsItsContextEnds(t *testing.T) {
	const topic = "reader-poll-race"
	addr := seeded(t, topic, 1, 10, 1) // offsets 0..9, one produce request
	r := newKgoPartitionReader([]string{addr}, nil, topic, 0, 100*time.Millisecond, DefaultMaxDecompressedBytes, streamtest.Logger(t, slog.LevelWarn))
	t.Cleanup(func() { _ = r.Close() })
	pollCtx, end := context.WithCancel(context.Background())
	defer end()
	r.opts = []kgo.Opt{kgo.WithHooks(&endOnFirstPoll{end: end})}
	require.NoError(t, r.SetOffset(0))

	var got []int64
	// The first fetch's context ends while its poll hands the records over.
	m, err := r.FetchMessage(pollCtx)
	if err != nil {
		require.ErrorIs(t, err, context.Canceled)
	} else {
		got = append(got, m.Offset)
	}
	require.Error(t, pollCtx.Err(), "the hook ended the context during the poll")

	publish(t, addr, kafka.Message{Topic: topic, Key: []byte("k0"), Value: []byte("10")}) // offset 10
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	for len(got) == 0 || got[len(got)-1] < 10 {
		m, err := r.FetchMessage(ctx)
		require.NoError(t, err, "offsets so far: %v", got)
		got = append(got, m.Offset)
	}
	require.Equal(t, []int64{0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10}, got, "every offset, in order, none skipped")
}
