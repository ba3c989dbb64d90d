//go:build linux

package journal

import (
	"bytes"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// fillDisk writes a file in dir until the filesystem answers ENOSPC and
// returns a func that removes it (the disk has room again).
func fillDisk(t *testing.T, dir string) (free func()) {
	t.Helper()
	path := filepath.Join(dir, "filler")
	f, err := os.Create(path)
	require.NoError(t, err)
	defer f.Close()
	chunk := make([]byte, 4096)
	for {
		if _, err = f.Write(chunk); err != nil {
			break
		}
	}
	require.ErrorIs(t, err, syscall.ENOSPC, "the tmpfs is full")
	return func() { require.NoError(t, os.Remove(path)) }
}

// TestJournalKeepsWhatAFullDiskRefusesInMemory: on a disk full to the last
// page (the free-space check fooled, so the writes themselves get ENOSPC
// from the kernel), the journal keeps what fits in its memory buffer, drops
// and counts exactly the rest as memory_full, and every kept message reaches
// Kafka in order — whether the disk or Kafka comes back first. Without the
// buffer, every message appended on the full disk was lost as write_error.
func TestJournalKeepsWhatAFullDiskRefusesInMemory(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the Kafka-protocol broker (kfake)")
	}
	const (
		before = 50  // on disk before it fills
		batch  = 40  // ~6 KB a batch: more than the last page's slack
		during = 400 // appended while the disk is full
		fit    = 150 // messages the memory buffer holds
		after  = 10  // appended once the disk has room again
	)
	msg := func(i int) []byte { m := journalMsg(100000 + i); return appendRecord(nil, &m) }
	size := len(msg(0)) // every message has the same size
	for _, tt := range []struct {
		name     string
		diskBack bool // the disk has room again before Kafka is back
	}{
		{name: "disk back first", diskBack: true},
		{name: "kafka back while the disk is full", diskBack: false},
	} {
		t.Run(tt.name, func(t *testing.T) {
			dir := mountTmpfs(t, "1m", false)
			reg := prometheus.NewRegistry()
			var logs bytes.Buffer // slog's handler serializes writes; read before Run starts
			j := openTestJournal(t, dir, reg, func(c *Config) {
				c.SegmentBytes, c.MaxBytes, c.ReserveBytes = 64<<10, 1<<30, 1
				c.MemoryBytes = int64(fit*size + size/2)
				c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
			})
			j.free = func(string) (int64, error) { return 1 << 40, nil } // statfs says there is room; the writes say ENOSPC
			require.NoError(t, j.Append(journalMsgs(100000, before)))
			onDisk := j.Stats().Bytes
			freeDisk := fillDisk(t, dir)

			var refused int
			for b := 0; b < during; b += batch {
				if err := j.Append(journalMsgs(100000+before+b, batch)); err != nil {
					require.ErrorIs(t, err, ErrFull)
					refused++
				}
			}
			st := j.Stats()
			require.Equal(t, fit, st.MemoryMessages, "what fits is kept in memory")
			require.EqualValues(t, fit*size, st.MemoryBytes)
			require.EqualValues(t, fit*size, testutil.ToFloat64(j.memoryGauge))
			require.Equal(t, onDisk, st.Bytes, "nothing reached the full disk")
			require.EqualValues(t, before+fit, st.Pending)
			require.EqualValues(t, during-fit, testutil.ToFloat64(j.dropped[journalDropMemoryFull]), "the rest dropped, each counted once")
			require.Zero(t, testutil.ToFloat64(j.dropped[journalDropWriteError]))
			require.Zero(t, testutil.ToFloat64(j.dropped[journalDropCap]))
			require.Equal(t, (during-fit)/batch+1, refused, "appends that dropped some say so")
			require.EqualValues(t, j.lost.Load(), during-fit)
			// A full disk whose batches memory keeps loses nothing: a WARN
			// with the counts. ERROR is for the loss (memory full too).
			lines := strings.Split(strings.TrimSpace(logs.String()), "\n")
			var warns, errs []string
			for _, l := range lines {
				switch {
				case strings.Contains(l, "level=WARN"):
					warns = append(warns, l)
				case strings.Contains(l, "level=ERROR"):
					errs = append(errs, l)
				}
			}
			require.Len(t, warns, 1, "one warning line for the refused batches memory kept (once per 10 s): %s", logs.String())
			require.Contains(t, warns[0], "journal disk refuses writes: messages kept in memory")
			require.Contains(t, warns[0], "no space left on device")
			require.Contains(t, warns[0], "messages=")
			require.Len(t, errs, 1, "one error line for %d batches that lost messages (once per 10 s): %s", (during-fit)/batch, logs.String())
			require.Contains(t, errs[0], "messages dropped")
			require.Contains(t, errs[0], fmt.Sprintf("messages_dropped=%d", batch-(fit%batch)))

			if tt.diskBack {
				freeDisk()
				j.mu.Lock()
				j.memRetryAt = time.Time{} // the next append tries the disk now
				j.mu.Unlock()
				require.NoError(t, j.Append(journalMsgs(100000+before+during, after)))
				st := j.Stats()
				require.Zero(t, st.MemoryMessages, "memory written to disk")
				require.Zero(t, testutil.ToFloat64(j.memoryGauge))
				require.EqualValues(t, before+fit+after, st.Pending)
				require.Greater(t, st.Bytes, onDisk)
			}

			topic := "t"
			addr := kafkatest.Start(t, map[string]int32{topic: 1})
			p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{addr}, Topic: topic, BatchTimeout: time.Millisecond})
			t.Cleanup(func() { _ = p.Close() })
			stop := runJournal(t, j, p)
			require.Eventually(t, func() bool { return j.Stats().Pending == 0 }, waitFor, 5*time.Millisecond)
			require.NoError(t, stop())
			require.Zero(t, testutil.ToFloat64(j.memoryGauge))

			var wantIDs []int
			for i := range before + fit {
				wantIDs = append(wantIDs, i)
			}
			if tt.diskBack {
				for i := range after {
					wantIDs = append(wantIDs, before+during+i)
				}
			}
			var ids []int
			for _, m := range kafkatest.ReadPartition(t, addr, topic, 0, len(wantIDs)) {
				ids = append(ids, msgIndex(t, m)-100000)
			}
			require.Equal(t, wantIDs, ids, "the disk's messages, then those kept in memory, in order")
			ends := kafkatest.EndOffsets(t, addr, topic, 1)
			require.EqualValues(t, len(wantIDs), ends[0], "nothing else reached Kafka")
			if !tt.diskBack {
				freeDisk()
			}
		})
	}
}

// TestJournalMemoryKeepsOrderWhileItIsPublished: while the drainer publishes
// the oldest records from memory, appends go behind them in memory even if
// the disk has room again (writing memory to disk then would put the batch in
// flight behind newer records); afterwards everything arrives once, in the
// order it was appended.
func TestJournalMemoryKeepsOrderWhileItIsPublished(t *testing.T) {
	dir := mountTmpfs(t, "1m", false)
	j := openTestJournal(t, dir, prometheus.NewRegistry(), func(c *Config) {
		c.SegmentBytes, c.MaxBytes, c.ReserveBytes, c.MemoryBytes = 64<<10, 1<<30, 1, 1<<20
	})
	j.free = func(string) (int64, error) { return 1 << 40, nil } // the writes themselves get ENOSPC
	freeDisk := fillDisk(t, dir)
	for b := range 4 {
		require.NoError(t, j.Append(journalMsgs(b*25, 25)))
	}
	require.Equal(t, 100, j.Stats().MemoryMessages, "no segment could be created: all in memory")

	pub := &fakePublisher{block: make(chan struct{})}
	stop := runJournal(t, j, pub)
	require.Eventually(t, func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return j.memBusy > 0
	}, waitFor, time.Millisecond, "the drainer publishes from memory")
	freeDisk()
	j.mu.Lock()
	j.memRetryAt = time.Time{}
	j.mu.Unlock()
	require.NoError(t, j.Append(journalMsgs(100, 50)))
	st := j.Stats()
	require.Equal(t, 150, st.MemoryMessages, "behind the batch in flight, not on disk")
	require.Zero(t, st.Segments)

	close(pub.block)
	require.NoError(t, j.Append(journalMsgs(150, 10))) // memory goes to disk now, or is still being published
	require.Eventually(t, func() bool { return j.Stats().Pending == 0 }, waitFor, time.Millisecond)
	require.NoError(t, stop())
	got := pub.received()
	require.Len(t, got, 160)
	for i, m := range got {
		require.Equal(t, i, msgIndex(t, m), "in the order appended")
	}
	require.Zero(t, testutil.ToFloat64(j.memoryGauge))
}
