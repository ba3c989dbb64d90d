package journal

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/stream/streamtest"
)

// waitFor bounds how long a test waits for the journal to get somewhere.
const waitFor = 20 * time.Second

// journalMsg is message i of a test stream: 7 keys, a ce_id, a value
// carrying i.
func journalMsg(i int) kafka.Message {
	return kafka.Message{
		Topic:   "t",
		Key:     []byte("k" + strconv.Itoa(i%7)),
		Value:   []byte(fmt.Sprintf(`{"i":%d,"pad":"%s"}`, i, bytes.Repeat([]byte("x"), 100))),
		Headers: []kafka.Header{{Key: stream.HeaderCEID, Value: []byte("id-" + strconv.Itoa(i))}},
		Time:    time.Unix(1700000000, int64(i)*1000).UTC(),
	}
}

func journalMsgs(from, n int) []kafka.Message {
	out := make([]kafka.Message, n)
	for i := range out {
		out[i] = journalMsg(from + i)
	}
	return out
}

func msgIndex(t testing.TB, m kafka.Message) int {
	t.Helper()
	id := kafkatest.Headers(m.Headers)[stream.HeaderCEID]
	i, err := strconv.Atoi(id[len("id-"):])
	require.NoError(t, err, "ce_id %q", id)
	return i
}

func openTestJournal(t testing.TB, dir string, reg *prometheus.Registry, mutate func(*Config)) *Journal {
	t.Helper()
	cfg := Config{
		Dir: dir, Name: "test", SegmentBytes: 16 << 10, MaxBytes: 64 << 20,
		ReplayBatchSize: 50, ReplayInitialBackoff: time.Millisecond, ReplayMaxBackoff: 5 * time.Millisecond,
		Logger: streamtest.Logger(t, slog.LevelError+1), Registerer: reg,
	}
	if mutate != nil {
		mutate(&cfg)
	}
	j, err := Open(cfg)
	require.NoError(t, err)
	t.Cleanup(func() { _ = j.Close() })
	return j
}

// runJournal runs j in the background; stop cancels it and returns Run's error.
func runJournal(t testing.TB, j *Journal, pub ReplayPublisher) (stop func() error) {
	t.Helper()
	return streamtest.Start(t, waitFor, func(ctx context.Context) error { return j.Run(ctx, pub) })
}

// replayUntil runs j with pub until it holds pending unacknowledged
// messages, then stops it.
func replayUntil(t testing.TB, j *Journal, pub ReplayPublisher, pending int64) {
	t.Helper()
	stop := runJournal(t, j, pub)
	require.Eventually(t, func() bool { return j.Stats().Pending == pending }, waitFor, time.Millisecond)
	require.NoError(t, stop())
}

// fakePublisher records what it acknowledges; fail decides per call and
// message index whether that message fails (nil: nothing fails).
type fakePublisher struct {
	mu    sync.Mutex
	calls int
	got   []kafka.Message
	fail  func(call, i int) bool
	block chan struct{} // when set, Publish waits for it (or ctx)
}

func (f *fakePublisher) Publish(ctx context.Context, msgs ...kafka.Message) error {
	if f.block != nil {
		select {
		case <-f.block:
		case <-ctx.Done():
			return ctx.Err()
		}
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.calls++
	werrs := make(kafka.WriteErrors, len(msgs))
	var failed bool
	for i, m := range msgs {
		if f.fail != nil && f.fail(f.calls, i) {
			werrs[i] = errors.New("injected")
			failed = true
			continue
		}
		f.got = append(f.got, m)
	}
	if failed {
		return fmt.Errorf("publish %d messages: %w", len(msgs), werrs)
	}
	return nil
}

func (f *fakePublisher) received() []kafka.Message {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]kafka.Message(nil), f.got...)
}

func segmentFiles(t testing.TB, dir string) []string {
	t.Helper()
	m, err := filepath.Glob(filepath.Join(dir, "*"+segmentFileSuffix))
	require.NoError(t, err)
	return m
}

func TestJournalRecordRoundTrip(t *testing.T) {
	tests := []struct {
		name string
		msg  kafka.Message
	}{
		{name: "full", msg: journalMsg(42)},
		{name: "nil key and value, zero time", msg: kafka.Message{Topic: "t"}},
		{name: "empty key and value", msg: kafka.Message{Topic: "t", Key: []byte{}, Value: []byte{}}},
		{name: "header with nil and empty values", msg: kafka.Message{Topic: "t", Headers: []kafka.Header{{Key: "a"}, {Key: "", Value: []byte{}}}}},
		{name: "large value", msg: kafka.Message{Topic: "topic.with.dots", Value: bytes.Repeat([]byte{0xff}, 1<<20)}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			rec := appendRecord(nil, &tt.msg)
			rr := newRecordReader(bytes.NewReader(rec))
			payload, n, err := rr.next()
			require.NoError(t, err)
			require.EqualValues(t, len(rec), n)
			got, err := decodeRecord(payload)
			require.NoError(t, err)
			require.Equal(t, tt.msg, got)
			_, _, err = rr.next()
			require.ErrorIs(t, err, io.EOF, "a clean end")
		})
	}
}

func TestJournalAppendReopenReplay(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	j := openTestJournal(t, dir, reg, nil)
	for b := range 10 {
		require.NoError(t, j.Append(journalMsgs(b*100, 100)))
	}
	require.Greater(t, len(segmentFiles(t, dir)), 1, "16 KiB segments roll")
	require.NoError(t, j.Close())
	require.ErrorIs(t, j.Append(journalMsgs(0, 1)), ErrClosed)

	reg2 := prometheus.NewRegistry()
	j2 := openTestJournal(t, dir, reg2, nil)
	require.EqualValues(t, 1000, j2.Stats().Pending)
	require.Equal(t, 1000.0, streamtest.MetricValue(t, reg2, "floodgate_stream_journal_pending", nil))
	pub := &fakePublisher{}
	replayUntil(t, j2, pub, 0)

	got := pub.received()
	require.Len(t, got, 1000)
	for i, m := range got {
		require.Equal(t, journalMsg(i), m, "replayed in append order")
	}
	require.Empty(t, segmentFiles(t, dir), "replayed segments are deleted")
	require.Equal(t, 1000.0, streamtest.MetricValue(t, reg2, "floodgate_stream_journal_replayed_total", nil))
	require.Zero(t, streamtest.MetricValue(t, reg2, "floodgate_stream_journal_bytes", nil))
}

func TestJournalRecoversTornTail(t *testing.T) {
	tests := []struct {
		name        string
		mutate      func(b []byte) []byte
		wantRecords int64
	}{
		{name: "cut inside the last header", mutate: func(b []byte) []byte { return b[:len(b)-lastRecordSize(b)+3] }, wantRecords: 9},
		{name: "cut inside the last payload", mutate: func(b []byte) []byte { return b[:len(b)-5] }, wantRecords: 9},
		{name: "flipped bit in the last payload", mutate: func(b []byte) []byte { b[len(b)-5] ^= 0x10; return b }, wantRecords: 9},
		{name: "zero-filled tail after a crash", mutate: func(b []byte) []byte { return append(b, make([]byte, 4096)...) }, wantRecords: 10},
		{name: "garbage length", mutate: func(b []byte) []byte { return append(b, 0x7f, 0xff, 0xff, 0xff, 1, 2, 3, 4, 5) }, wantRecords: 10},
		{name: "flipped bit in the first record", mutate: func(b []byte) []byte { b[len(segmentMagic)+12] ^= 1; return b }, wantRecords: 0},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			j := openTestJournal(t, dir, prometheus.NewRegistry(), nil)
			require.NoError(t, j.Append(journalMsgs(0, 10)))
			require.NoError(t, j.Close())
			files := segmentFiles(t, dir)
			require.Len(t, files, 1)
			b, err := os.ReadFile(files[0])
			require.NoError(t, err)
			orig := len(b)
			b = tt.mutate(b)
			require.NoError(t, os.WriteFile(files[0], b, 0o640))

			reg := prometheus.NewRegistry()
			j2 := openTestJournal(t, dir, reg, nil)
			require.Equal(t, tt.wantRecords, j2.Stats().Pending)
			cut := streamtest.MetricValue(t, reg, "floodgate_stream_journal_truncated_bytes_total", nil)
			require.Positive(t, cut, "the cut is counted")
			if tt.wantRecords > 0 {
				st, err := os.Stat(files[0])
				require.NoError(t, err)
				require.LessOrEqual(t, st.Size(), int64(orig))
				require.Equal(t, float64(len(b))-cut, float64(st.Size()))
			}

			// Appends after recovery go to a new segment; replay sees the
			// surviving prefix, then the new records, in order.
			require.NoError(t, j2.Append(journalMsgs(100, 3)))
			pub := &fakePublisher{}
			replayUntil(t, j2, pub, 0)
			want := append(journalMsgs(0, int(tt.wantRecords)), journalMsgs(100, 3)...)
			require.Equal(t, want, pub.received())
		})
	}
}

// lastRecordSize is the framed size of the last of ten equal-sized records.
func lastRecordSize(seg []byte) int { return (len(seg) - len(segmentMagic)) / 10 }

func TestJournalReplayRetriesOnlyWhatFailed(t *testing.T) {
	// When single messages fail, the fake acknowledges the others of the
	// same key (a real partition fails whole), so per-key order is checked
	// only for whole-batch failures.
	tests := []struct {
		name       string
		fail       func(call, i int) bool
		keyOrdered bool
	}{
		{name: "whole batches fail at first", fail: func(call, _ int) bool { return call <= 3 }, keyOrdered: true},
		{name: "some messages fail (one partition down)", fail: func(call, i int) bool { return call%2 == 1 && i%3 == 0 }},
		{name: "the first message keeps failing a while", fail: func(call, i int) bool { return call <= 5 && i == 0 }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			reg := prometheus.NewRegistry()
			j := openTestJournal(t, dir, reg, nil)
			require.NoError(t, j.Append(journalMsgs(0, 500)))
			pub := &fakePublisher{fail: tt.fail}
			replayUntil(t, j, pub, 0)

			got := pub.received()
			require.Len(t, got, 500, "every message acknowledged exactly once: only failed ones are retried")
			seen := map[int]bool{}
			lastPerKey := map[string]int{}
			for _, m := range got {
				i := msgIndex(t, m)
				require.False(t, seen[i], "message %d twice", i)
				seen[i] = true
				if prev, ok := lastPerKey[string(m.Key)]; ok && tt.keyOrdered {
					require.Greater(t, i, prev, "key %s out of order", m.Key)
				}
				lastPerKey[string(m.Key)] = i
			}
			require.Empty(t, segmentFiles(t, dir))
			require.Positive(t, streamtest.MetricValue(t, reg, "floodgate_stream_journal_replay_errors_total", nil))
			require.Equal(t, 500.0, streamtest.MetricValue(t, reg, "floodgate_stream_journal_replayed_total", nil))
		})
	}
}

// TestJournalCheckpointOnRestart: a segment is kept while any of it is
// unacknowledged, and a restart resumes after its checkpoint — or, when the
// checkpoint is unreadable, replays the whole segment (at-least-once:
// consumers dedupe by ce_id).
func TestJournalCheckpointOnRestart(t *testing.T) {
	tests := []struct {
		name        string
		corrupt     bool
		wantPending int64
		wantReplay  []kafka.Message // by the restarted journal
	}{
		{name: "resumes after the acknowledged batch", wantPending: 150, wantReplay: journalMsgs(50, 150)},
		{name: "unreadable checkpoint replays the whole segment", corrupt: true, wantPending: 200, wantReplay: journalMsgs(0, 200)},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			dir := t.TempDir()
			j := openTestJournal(t, dir, prometheus.NewRegistry(), nil)
			require.NoError(t, j.Append(journalMsgs(0, 200)))
			// Acknowledge the first batch (50), then fail everything.
			pub := &fakePublisher{fail: func(call, _ int) bool { return call > 1 }}
			replayUntil(t, j, pub, 150)
			require.Equal(t, journalMsgs(0, 50), pub.received())
			require.NotEmpty(t, segmentFiles(t, dir), "a segment is kept while any of it is unacknowledged")
			if tt.corrupt {
				cks, err := filepath.Glob(filepath.Join(dir, "*"+checkpointSuffix))
				require.NoError(t, err)
				require.Len(t, cks, 1)
				require.NoError(t, os.WriteFile(cks[0], []byte("garbage"), 0o640))
			}

			j2 := openTestJournal(t, dir, prometheus.NewRegistry(), nil)
			require.Equal(t, tt.wantPending, j2.Stats().Pending)
			pub2 := &fakePublisher{}
			replayUntil(t, j2, pub2, 0)
			require.Equal(t, tt.wantReplay, pub2.received())
			require.Empty(t, segmentFiles(t, dir))
		})
	}
}

func TestJournalCapDropsOldestAndCounts(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	const maxBytes = 64 << 10
	j := openTestJournal(t, dir, reg, func(c *Config) { c.SegmentBytes = 8 << 10; c.MaxBytes = maxBytes })
	const n = 2000
	for b := range n / 20 {
		require.NoError(t, j.Append(journalMsgs(b*20, 20)))
		require.LessOrEqual(t, j.Stats().Bytes, int64(maxBytes))
	}
	dropped := streamtest.MetricValue(t, reg, "floodgate_stream_journal_dropped_total", map[string]string{"reason": "cap"})
	require.Positive(t, dropped)
	st := j.Stats()
	require.Equal(t, float64(n), float64(st.Pending)+dropped, "every message is pending or counted as dropped")
	require.Equal(t, float64(st.Bytes), streamtest.MetricValue(t, reg, "floodgate_stream_journal_bytes", nil))

	// What survives is the newest messages, in order.
	pub := &fakePublisher{}
	replayUntil(t, j, pub, 0)
	got := pub.received()
	require.Equal(t, journalMsgs(n-len(got), len(got)), got)
}

func TestJournalCapNeverDropsTheSegmentBeingPublished(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	j := openTestJournal(t, dir, reg, func(c *Config) { c.SegmentBytes = 8 << 10; c.MaxBytes = 32 << 10 })
	require.NoError(t, j.Append(journalMsgs(0, 50)))
	pub := &fakePublisher{block: make(chan struct{})}
	stop := runJournal(t, j, pub)
	require.Eventually(t, func() bool {
		j.mu.Lock()
		defer j.mu.Unlock()
		return len(j.segs) > 0 && j.segs[0].busy
	}, waitFor, time.Millisecond)
	for b := range 100 {
		_ = j.Append(journalMsgs(1000+b*10, 10))
	}
	close(pub.block)
	require.Eventually(t, func() bool { return j.Stats().Pending == 0 }, waitFor, time.Millisecond)
	require.NoError(t, stop())
	got := pub.received()
	require.Equal(t, journalMsgs(0, 50), got[:50], "the batch in flight was not dropped under it")
	dropped := streamtest.MetricValue(t, reg, "floodgate_stream_journal_dropped_total", map[string]string{"reason": "cap"})
	require.Positive(t, dropped)
	require.Equal(t, float64(50+1000), float64(len(got))+dropped, "replayed + dropped = appended")
}

func TestJournalOfferNeverBlocksAndCountsRefusals(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	j := openTestJournal(t, dir, reg, func(c *Config) { c.QueueSize = 4 })
	var taken int
	for i := range 10 { // Run is not running: nothing drains the queue
		if j.Offer(journalMsg(i)) {
			taken++
		}
	}
	require.Equal(t, 4, taken)
	require.Equal(t, 6.0, streamtest.MetricValue(t, reg, "floodgate_stream_journal_dropped_total", map[string]string{"reason": "queue_full"}))
	require.NoError(t, j.Close(), "Close writes what was offered")
	require.False(t, j.Offer(journalMsg(99)))
	require.Equal(t, 1.0, streamtest.MetricValue(t, reg, "floodgate_stream_journal_dropped_total", map[string]string{"reason": "closed"}))
	require.Equal(t, 4.0, streamtest.MetricValue(t, reg, "floodgate_stream_journaled_total", map[string]string{"source": "overflow"}))

	j2 := openTestJournal(t, dir, prometheus.NewRegistry(), nil)
	require.EqualValues(t, 4, j2.Stats().Pending)
}

func TestJournalRunWritesOffersAndSyncsOnInterval(t *testing.T) {
	dir := t.TempDir()
	reg := prometheus.NewRegistry()
	j := openTestJournal(t, dir, reg, func(c *Config) {
		c.Sync = SyncInterval
		c.SyncInterval = 5 * time.Millisecond
	})
	stop := runJournal(t, j, nil) // store only
	for i := range 100 {
		require.True(t, j.Offer(journalMsg(i)))
	}
	require.Eventually(t, func() bool { return j.Stats().Pending == 100 }, waitFor, time.Millisecond)
	require.Eventually(t, func() bool {
		return streamtest.MetricValue(t, reg, "floodgate_stream_journal_fsync_seconds", nil) >= 1
	}, waitFor, time.Millisecond, "the interval syncer fsyncs")
	require.NoError(t, stop())
	j2 := openTestJournal(t, dir, prometheus.NewRegistry(), nil)
	require.EqualValues(t, 100, j2.Stats().Pending)
}

func TestJournalDropsMessagesWithoutTopic(t *testing.T) {
	reg := prometheus.NewRegistry()
	j := openTestJournal(t, t.TempDir(), reg, nil)
	require.NoError(t, j.Append([]kafka.Message{{Value: []byte("no topic")}, journalMsg(1)}))
	require.EqualValues(t, 1, j.Stats().Pending)
	require.Equal(t, 1.0, streamtest.MetricValue(t, reg, "floodgate_stream_journal_dropped_total", map[string]string{"reason": "no_topic"}))
}

func TestJournalDirectoryIsLocked(t *testing.T) {
	dir := t.TempDir()
	j := openTestJournal(t, dir, prometheus.NewRegistry(), nil)
	_, err := Open(Config{Dir: dir})
	require.ErrorIs(t, err, ErrLocked)
	require.NoError(t, j.Close())
	j2, err := Open(Config{Dir: dir})
	require.NoError(t, err, "Close releases the lock")
	require.NoError(t, j2.Close())
}

func TestJournalConfigValidate(t *testing.T) {
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{name: "defaults", cfg: Config{Dir: "/tmp/j"}},
		{name: "no dir", cfg: Config{}, want: []string{"journal.Config.Dir (FLOODGATE_JOURNAL_DIR): required"}},
		{name: "tiny segments", cfg: Config{Dir: "d", SegmentBytes: 100}, want: []string{"journal.Config.SegmentBytes (FLOODGATE_JOURNAL_SEGMENT_BYTES)"}},
		{name: "cap below two segments", cfg: Config{Dir: "d", SegmentBytes: 1 << 20, MaxBytes: 1 << 20}, want: []string{"journal.Config.MaxBytes (FLOODGATE_JOURNAL_MAX_BYTES)"}},
		{name: "bad sync", cfg: Config{Dir: "d", Sync: 7}, want: []string{"journal.Config.Sync (FLOODGATE_JOURNAL_SYNC)"}},
		{name: "negatives", cfg: Config{Dir: "d", QueueSize: -1, SyncInterval: -1, ReplayTimeout: -1, MemoryBytes: -1}, want: []string{
			"journal.Config.QueueSize (FLOODGATE_JOURNAL_QUEUE)", "journal.Config.SyncInterval", "journal.Config.ReplayTimeout",
			"journal.Config.MemoryBytes (FLOODGATE_JOURNAL_MEMORY_BYTES): must not be negative"}},
		{name: "backoff order", cfg: Config{Dir: "d", ReplayInitialBackoff: time.Minute, ReplayMaxBackoff: time.Second}, want: []string{"journal.Config.ReplayMaxBackoff"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			err := tt.cfg.Validate()
			if len(tt.want) == 0 {
				require.NoError(t, err)
				return
			}
			require.ErrorIs(t, err, stream.ErrInvalidConfig)
			for _, w := range tt.want {
				require.ErrorContains(t, err, w)
			}
		})
	}
}

func TestJournalConfigFromEnv(t *testing.T) {
	tests := []struct {
		name    string
		env     map[string]string
		want    Config
		wantErr string
	}{
		{name: "unset disables", env: nil, want: Config{SegmentBytes: DefaultSegmentBytes, MaxBytes: DefaultMaxBytes,
			ReserveBytes: DefaultReserveBytes, MemoryBytes: DefaultMemoryBytes, SyncInterval: DefaultSyncInterval, QueueSize: DefaultQueueSize}},
		{name: "all set", env: map[string]string{"FLOODGATE_JOURNAL_DIR": "/var/lib/fg", "FLOODGATE_JOURNAL_SEGMENT_BYTES": "1048576",
			"FLOODGATE_JOURNAL_MAX_BYTES": "8388608", "FLOODGATE_JOURNAL_SYNC": "interval", "FLOODGATE_JOURNAL_SYNC_INTERVAL": "50ms", "FLOODGATE_JOURNAL_QUEUE": "100",
			"FLOODGATE_JOURNAL_RESERVE_BYTES": "1048576", "FLOODGATE_JOURNAL_MEMORY_BYTES": "2097152"},
			want: Config{Dir: "/var/lib/fg", SegmentBytes: 1 << 20, MaxBytes: 8 << 20, ReserveBytes: 1 << 20, MemoryBytes: 2 << 20, Sync: SyncInterval, SyncInterval: 50 * time.Millisecond, QueueSize: 100}},
		{name: "bad sync", env: map[string]string{"FLOODGATE_JOURNAL_SYNC": "always"}, wantErr: "FLOODGATE_JOURNAL_SYNC"},
		{name: "bad number", env: map[string]string{"FLOODGATE_JOURNAL_MAX_BYTES": "1GB"}, wantErr: "FLOODGATE_JOURNAL_MAX_BYTES"},
		{name: "bad reserve", env: map[string]string{"FLOODGATE_JOURNAL_RESERVE_BYTES": "lots"}, wantErr: "FLOODGATE_JOURNAL_RESERVE_BYTES"},
		{name: "bad memory", env: map[string]string{"FLOODGATE_JOURNAL_MEMORY_BYTES": "32MiB"}, wantErr: "FLOODGATE_JOURNAL_MEMORY_BYTES"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := ConfigFromEnv(func(k string) string { return tt.env[k] })
			if tt.wantErr != "" {
				require.ErrorContains(t, err, tt.wantErr)
				return
			}
			require.NoError(t, err)
			require.Equal(t, tt.want, got)
		})
	}
}

func TestWithEventID(t *testing.T) {
	tests := []struct {
		name    string
		in      []kafka.Header
		keepsID string // "" means a fresh id is expected
	}{
		{name: "no headers", in: nil},
		{name: "other headers", in: []kafka.Header{{Key: "a", Value: []byte("1")}}},
		{name: "empty ce_id replaced", in: []kafka.Header{{Key: stream.HeaderCEID}}},
		{name: "ce_id kept", in: []kafka.Header{{Key: stream.HeaderCEID, Value: []byte("evt-1")}}, keepsID: "evt-1"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			before := append([]kafka.Header(nil), tt.in...)
			out := withEventID(tt.in)
			require.Equal(t, before, tt.in, "the caller's headers are not modified")
			ids := 0
			for _, h := range out {
				if h.Key == stream.HeaderCEID {
					ids++
					if tt.keepsID != "" {
						require.Equal(t, tt.keepsID, string(h.Value))
					} else {
						require.Len(t, h.Value, 36, "a UUID")
					}
				}
			}
			require.Equal(t, 1, ids)
		})
	}
}

func TestDurableProducerConfigValidate(t *testing.T) {
	err := DurableProducerConfig{
		Async:   stream.AsyncProducerConfig{Brokers: []string{"a:1"}, OnFailed: func([]kafka.Message) {}},
		Journal: Config{Dir: "d", SegmentBytes: 1},
	}.Validate()
	require.ErrorContains(t, err, "AsyncProducerConfig.OnFailed")
	require.ErrorContains(t, err, "journal.Config.SegmentBytes")
	require.NoError(t, DurableProducerConfig{Async: stream.AsyncProducerConfig{Brokers: []string{"a:1"}}}.Validate(), "journal disabled")
}

// FuzzJournalRecord: decoding arbitrary payloads never panics, and whatever
// decodes re-encodes to a record that decodes to the same message.
func FuzzJournalRecord(f *testing.F) {
	for _, m := range []kafka.Message{journalMsg(1), {Topic: "t"}, {Topic: "x", Headers: []kafka.Header{{Key: "k"}}}} {
		rec := appendRecord(nil, &m)
		f.Add(rec[recordHeaderSize:])
	}
	f.Add([]byte{1, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x01})
	f.Fuzz(func(t *testing.T, payload []byte) {
		m, err := decodeRecord(payload)
		if err != nil {
			return
		}
		rec := appendRecord(nil, &m)
		rr := newRecordReader(bytes.NewReader(rec))
		p2, _, err := rr.next()
		require.NoError(t, err)
		m2, err := decodeRecord(p2)
		require.NoError(t, err)
		require.Equal(t, m, m2)
	})
}

// FuzzJournalSegmentScan: scanning arbitrary segment bytes never panics, the
// valid prefix it reports rescans cleanly to the same record count.
func FuzzJournalSegmentScan(f *testing.F) {
	var seg []byte
	seg = append(seg, segmentMagic...)
	for i := range 3 {
		m := journalMsg(i)
		seg = appendRecord(seg, &m)
	}
	f.Add(seg)
	f.Add(seg[:len(seg)-7])
	f.Add([]byte(segmentMagic + "\x00\x00\x00\x05\x00\x00\x00\x00abcde"))
	f.Fuzz(func(t *testing.T, b []byte) {
		records, valid, _, err := scanSegment(bytes.NewReader(b), nil)
		if err != nil {
			return
		}
		require.LessOrEqual(t, valid, int64(len(b)))
		if valid == 0 {
			return
		}
		r2, v2, torn, err := scanSegment(bytes.NewReader(b[:valid]), nil)
		require.NoError(t, err)
		require.False(t, torn)
		require.Equal(t, records, r2)
		require.Equal(t, valid, v2)
	})
}
