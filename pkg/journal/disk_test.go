//go:build linux

package journal

import (
	"bytes"
	"log/slog"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// mountTmpfs mounts a tmpfs of size on a new directory (read-only when ro)
// and unmounts it when the test ends. It needs root (mount); without it the
// test says so and skips — this is a filesystem the test makes, not a
// service that might be missing.
func mountTmpfs(t *testing.T, size string, ro bool) string {
	t.Helper()
	dir := t.TempDir()
	opts := "size=" + size
	if ro {
		opts += ",ro"
	}
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", opts, "tmpfs", dir).CombinedOutput(); err != nil {
		t.Skipf("mounting a tmpfs needs root: %v: %s", err, out)
	}
	t.Cleanup(func() { _ = exec.Command("umount", "-l", dir).Run() })
	return dir
}

// TestJournalCapFollowsFreeSpace: a journal allowed 1 GiB on a 2 MiB disk
// keeps under the disk's free space less its reserve and never fails a write
// with ENOSPC (on main: 18,944 of 50,000 events lost to write errors); what
// the disk has no room for goes to the memory buffer, what does not fit there
// is dropped and counted once as memory_full, and once Kafka is back exactly
// the kept messages — the oldest — reach it, in order.
func TestJournalCapFollowsFreeSpace(t *testing.T) {
	if testing.Short() {
		t.Skip("needs the Kafka-protocol broker (kfake)")
	}
	const batches, batch = 200, 100 // ~2.7 MB of records
	dir := mountTmpfs(t, "2m", false)
	reg := prometheus.NewRegistry()
	j := openTestJournal(t, dir, reg, func(c *Config) {
		c.MaxBytes, c.SegmentBytes, c.ReserveBytes, c.MemoryBytes = 1<<30, 64<<10, 256<<10, 512<<10
	})
	for b := range batches {
		if err := j.Append(journalMsgs(b*batch, batch)); err != nil {
			require.ErrorIs(t, err, ErrFull, "only a full memory buffer refuses")
		}
	}
	st := j.Stats()
	require.LessOrEqual(t, st.Bytes, int64(2<<20-256<<10), "under the free space less the reserve")
	require.Greater(t, st.MemoryBytes, int64(512<<10-2*1024), "the rest in memory, up to its bound")
	require.LessOrEqual(t, st.MemoryBytes, int64(512<<10))
	require.EqualValues(t, st.MemoryBytes, testutil.ToFloat64(j.memoryGauge))
	require.Zero(t, testutil.ToFloat64(j.dropped[journalDropWriteError]), "no write failed")
	require.Zero(t, testutil.ToFloat64(j.dropped[journalDropCap]), "nothing on disk was dropped for the disk's sake")
	memFull := testutil.ToFloat64(j.dropped[journalDropMemoryFull])
	require.Greater(t, memFull, 0.0)
	require.EqualValues(t, batches*batch, st.Pending+int64(memFull), "every message kept or counted, once")

	addr := kafkatest.Start(t, map[string]int32{"t": 1})
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{addr}, Topic: "t", BatchTimeout: time.Millisecond})
	t.Cleanup(func() { _ = p.Close() })
	replayUntil(t, j, p, 0)
	require.Zero(t, testutil.ToFloat64(j.memoryGauge))
	for i, m := range kafkatest.ReadPartition(t, addr, "t", 0, int(st.Pending)) {
		require.Equal(t, i, msgIndex(t, m), "the oldest kept, in order: disk, then memory")
	}
	require.EqualValues(t, st.Pending, kafkatest.EndOffsets(t, addr, "t", 1)[0])
}

// TestJournalErrorLinesAreBounded: a batch that can never fit is refused on
// every append, and logged once per interval with the count held back, not
// once per batch.
func TestJournalErrorLinesAreBounded(t *testing.T) {
	var logs bytes.Buffer
	j := openTestJournal(t, t.TempDir(), prometheus.NewRegistry(), func(c *Config) {
		c.MaxBytes, c.SegmentBytes = 32<<10, 16<<10
		c.Logger = slog.New(slog.NewTextHandler(&logs, nil))
	})
	for range 500 {
		require.ErrorIs(t, j.Append(journalMsgs(0, 1000)), ErrFull) // ~150 KB per batch
	}
	require.Equal(t, 1, strings.Count(logs.String(), "journal full"), logs.String())
	require.EqualValues(t, 500*1000, testutil.ToFloat64(j.dropped[journalDropCap]), "every refused message counted")
}

// TestDurableProducerRunsWithoutAnUnwritableJournal: a read-only journal
// directory, or a missing one that cannot be created, starts the producer in
// memory-only mode with a warning (on main the limiter refused to start).
func TestDurableProducerRunsWithoutAnUnwritableJournal(t *testing.T) {
	ro := mountTmpfs(t, "1m", true)
	for _, tt := range []struct{ name, dir string }{
		{name: "read-only", dir: ro},
		{name: "missing on a read-only filesystem", dir: filepath.Join(ro, "missing", "journal")},
	} {
		t.Run(tt.name, func(t *testing.T) {
			var logs bytes.Buffer
			d, err := NewDurableProducer(DurableProducerConfig{
				Async:   stream.AsyncProducerConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t", Logger: slog.New(slog.NewTextHandler(&logs, nil))},
				Journal: Config{Dir: tt.dir},
			})
			require.NoError(t, err, "starts")
			require.Nil(t, d.Journal(), "memory-only")
			require.ErrorIs(t, d.JournalError(), syscall.EROFS)
			require.Contains(t, logs.String(), "level=WARN msg=\"JOURNAL UNAVAILABLE")
			require.Contains(t, logs.String(), tt.dir)
			require.True(t, d.TryPublish(kafka.Message{Value: []byte("x")}), "still takes events")
		})
	}
}

// TestDurableProducerRefusesALockedJournal: a directory another journal
// holds is a configuration to fix, not a reason to run memory-only.
func TestDurableProducerRefusesALockedJournal(t *testing.T) {
	dir := t.TempDir()
	openTestJournal(t, dir, prometheus.NewRegistry(), nil)
	_, err := NewDurableProducer(DurableProducerConfig{
		Async:   stream.AsyncProducerConfig{Brokers: []string{"127.0.0.1:1"}, Topic: "t"},
		Journal: Config{Dir: dir},
	})
	require.ErrorIs(t, err, ErrLocked)
}
