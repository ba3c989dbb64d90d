package main_test

import (
	"bytes"
	"context"
	"flag"
	"fmt"
	"math/rand/v2"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/quota/internal/quotatest"
)

var big = flag.Bool("quota.big", false, "run the big fault test (also FLOODGATE_QUOTA_BIG=1); for make bench")

// TestFaultExactness produces decision events with known totals, runs the
// built quota binary as a subprocess, kills it with SIGKILL at random points
// several times, runs two instances at once to force rebalances, replays part
// of the DLQ and replays dead letters of this group (twice) and of another
// group — and requires the ledger to equal the expected totals exactly.
func TestFaultExactness(t *testing.T) {
	stacktest.Needs(t, "needs the local stack; run `make test`")
	size := struct{ events, principals, rounds, chunks int }{20_000, 300, 8, 8}
	if *big || os.Getenv("FLOODGATE_QUOTA_BIG") != "" {
		size.events, size.principals, size.rounds, size.chunks = 1_000_000, 20_000, 14, 40
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Minute)
	defer cancel()
	bin := buildQuota(t)
	broker := quotatest.Broker(t)
	db, prefix := quotatest.LedgerTable(t)
	redistest.Client(t) // fail loudly when Redis is missing: the binary needs it
	group := redistest.Unique(t, "quota-fault")
	topic := config.DefaultDecisionsTopic
	logs := t.TempDir()
	env := append(os.Environ(),
		"FLOODGATE_KAFKA_BROKERS="+broker,
		"FLOODGATE_QUOTA_GROUP="+group,
		"FLOODGATE_DYNAMODB_ENDPOINT="+quotatest.DynamoEndpoint(),
		"FLOODGATE_DYNAMODB_TABLE_PREFIX="+prefix,
		"FLOODGATE_QUOTA_ADDR=127.0.0.1:0",
		"FLOODGATE_QUOTA_FLUSH_INTERVAL=200ms",
		"FLOODGATE_QUOTA_SESSION_TIMEOUT=1s",
		"FLOODGATE_QUOTA_HEARTBEAT_INTERVAL=200ms",
		"FLOODGATE_QUOTA_REBALANCE_TIMEOUT=3s",
		"FLOODGATE_QUOTA_JOIN_BACKOFF=100ms",
		"FLOODGATE_QUOTA_FETCH_MAX_WAIT=100ms",
		"FLOODGATE_QUOTA_DRAIN_TIMEOUT=3s",
	)
	var started int
	start := func() *exec.Cmd {
		started++
		cmd := exec.Command(bin)
		cmd.Env = env
		f, err := os.Create(filepath.Join(logs, fmt.Sprintf("quota-%02d.log", started)))
		require.NoError(t, err)
		cmd.Stdout, cmd.Stderr = f, f
		require.NoError(t, cmd.Start())
		t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait(); _ = f.Close() })
		return cmd
	}
	kill := func(cmd *exec.Cmd) {
		require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
		_ = cmd.Wait()
	}
	defer func() {
		if t.Failed() {
			dumpLogs(t, logs)
		}
	}()

	w := quotatest.NewWorkload(uint64(time.Now().UnixNano()), size.principals)
	msgs := w.Messages(size.events, 997)
	writer := quotatest.Writer(broker)
	defer writer.Close()

	// Decisions arrive in chunks while instances are killed and restarted.
	var prodWG sync.WaitGroup
	prodWG.Add(1)
	go func() {
		defer prodWG.Done()
		per := (len(msgs) + size.chunks - 1) / size.chunks
		for i := 0; i < len(msgs); i += per {
			quotatest.Produce(ctx, t, writer, topic, msgs[i:min(i+per, len(msgs))])
			time.Sleep(150 * time.Millisecond)
		}
	}()

	rnd := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 3))
	for round := range size.rounds {
		a := start()
		var b *exec.Cmd
		if round%2 == 1 {
			b = start() // two members: the group rebalances on join and on each kill
		}
		time.Sleep(time.Duration(300+rnd.IntN(1200)) * time.Millisecond)
		kill(a)
		if b != nil {
			time.Sleep(time.Duration(200+rnd.IntN(800)) * time.Millisecond)
			kill(b)
		}
		if round == size.rounds/2 {
			replayDeadLetters(ctx, t, broker, writer, w, group, msgs)
		}
	}
	prodWG.Wait()

	// One instance finishes the stream; a clean SIGTERM ends it.
	last := start()
	lastLog := filepath.Join(logs, fmt.Sprintf("quota-%02d.log", started))
	require.Eventually(t, func() bool {
		ok, err := quotatest.Committed(ctx, broker, group, topic)
		return err == nil && ok
	}, 10*time.Minute, 200*time.Millisecond, "the group commits every partition to its end")
	// The group may be done before the last instance has even started; a
	// SIGTERM before it installed its handler would kill it, not drain it.
	require.Eventually(t, func() bool {
		b, err := os.ReadFile(lastLog)
		return err == nil && strings.Contains(string(b), "quota running")
	}, time.Minute, 50*time.Millisecond, "the last instance is running")
	require.NoError(t, last.Process.Signal(syscall.SIGTERM))
	require.NoError(t, last.Wait(), "a clean drain exits 0")

	got := quotatest.LedgerTotals(ctx, t, db, prefix+dynamo.TableQuotaLedger, w.Principals)
	var wantSum, gotSum int64
	for k, v := range w.Expected {
		wantSum += v
		if got[k] != v {
			t.Errorf("%s %s: ledger %d, expected %d", k.Principal, k.Day, got[k], v)
		}
	}
	for k, v := range got {
		gotSum += v
		if _, ok := w.Expected[k]; !ok {
			t.Errorf("%s %s: ledger %d, expected nothing", k.Principal, k.Day, v)
		}
	}
	require.Equal(t, wantSum, gotSum, "total units in the ledger")
	t.Logf("%d events, %d instances started, %d principal-days, %d units: ledger exact", len(msgs), started, len(w.Expected), wantSum)
}

// replayDeadLetters replays dead letters onto the decisions topic as the
// dlq-auditor does (the DLQ message with its dlq_* headers):
//   - half of what the quota group dead-lettered so far (poison again: no units);
//   - this group's dead letters of valid decisions, each twice (count once);
//   - another group's dead letters of decisions counted already (ignored).
func replayDeadLetters(ctx context.Context, t *testing.T, broker string, writer *kafka.Writer, w *quotatest.Workload, group string, msgs []kafka.Message) {
	t.Helper()
	topic := config.DefaultDecisionsTopic
	dead := readAll(ctx, t, broker, topic+".dlq")
	var replays []kafka.Message
	for i, m := range dead {
		if i%2 == 0 {
			replays = append(replays, kafka.Message{Key: m.Key, Value: m.Value, Headers: m.Headers})
		}
	}
	for i := range 50 {
		d := w.Decision() // counted once in Expected when allowed
		orig := quotatest.Message(d)
		rec := stream.DLQRecord{
			Key: orig.Key, Value: orig.Value, Headers: orig.Headers, SourceTopic: topic,
			Partition: i % 12, Offset: 10_000_000 + int64(i), Timestamp: d.TS, ConsumerGroup: group,
			Service: "quota", ErrorClass: stream.ClassPoison, ErrorMessage: "older schema", Attempts: 1, FirstFailure: d.TS,
		}
		replays = append(replays, rec.Message(topic), rec.Message(topic))
	}
	for i := range 50 {
		orig := msgs[i*7]
		rec := stream.DLQRecord{
			Key: orig.Key, Value: orig.Value, Headers: orig.Headers, SourceTopic: topic,
			Partition: 0, Offset: int64(i), Timestamp: time.Now(), ConsumerGroup: "floodgate-detector",
			Service: "detector", ErrorClass: stream.ClassTransientExhausted, ErrorMessage: "redis down", Attempts: 5, FirstFailure: time.Now(),
		}
		replays = append(replays, rec.Message(topic))
	}
	quotatest.Produce(ctx, t, writer, topic, replays)
	t.Logf("replayed %d messages (%d from the DLQ)", len(replays), (len(dead)+1)/2)
}

// readAll reads every message of every partition of topic up to its end.
func readAll(ctx context.Context, t *testing.T, broker, topic string) []kafka.Message {
	t.Helper()
	conn, err := kafka.DialContext(ctx, "tcp", broker)
	require.NoError(t, err)
	parts, err := conn.ReadPartitions(topic)
	_ = conn.Close()
	require.NoError(t, err)
	var out []kafka.Message
	for _, p := range parts {
		pc, err := kafka.DialLeader(ctx, "tcp", broker, topic, p.ID)
		require.NoError(t, err)
		end, err := pc.ReadLastOffset()
		_ = pc.Close()
		require.NoError(t, err)
		if end == 0 {
			continue
		}
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, Partition: p.ID, MaxWait: 100 * time.Millisecond})
		for {
			m, err := r.FetchMessage(ctx)
			require.NoError(t, err)
			out = append(out, m)
			if m.Offset >= end-1 {
				break
			}
		}
		_ = r.Close()
	}
	return out
}

func buildQuota(t *testing.T) string {
	t.Helper()
	bin := filepath.Join(t.TempDir(), "quota")
	out, err := exec.Command("go", "build", "-o", bin, ".").CombinedOutput()
	require.NoError(t, err, "go build: %s", out)
	return bin
}

func dumpLogs(t *testing.T, dir string) {
	files, _ := filepath.Glob(filepath.Join(dir, "*.log"))
	for _, f := range files {
		b, _ := os.ReadFile(f)
		lines := bytes.Split(bytes.TrimSpace(b), []byte("\n"))
		if len(lines) > 15 {
			lines = lines[len(lines)-15:]
		}
		t.Logf("--- %s (tail)\n%s", filepath.Base(f), strings.TrimSpace(string(bytes.Join(lines, []byte("\n")))))
	}
}
