package chaos

import (
	"context"
	"fmt"
	"os/exec"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// JournalDiskFull: the limiter's journal lives on a 4 MiB filesystem (a tmpfs
// the run mounts; it needs root) with a 2 MiB memory buffer while the broker
// is down for the outage under load, so the journal fills its disk and then
// its memory buffer. The limiter must answer throughout, lose only what the
// journal counts (beyond the memory buffer: memory_full), and log at most 10
// error lines a minute (on main: 18,944 of 50,000 events lost to write
// errors, 15,373 ERROR lines).
func JournalDiskFull(ctx context.Context, e *Env, s Size, r *Result) error {
	dir := e.TempDir("journal-disk")
	if out, err := exec.Command("mount", "-t", "tmpfs", "-o", "size=4m", "tmpfs", dir).CombinedOutput(); err != nil {
		return fmt.Errorf("mount a 4 MiB tmpfs for the journal (needs root): %w: %s", err, out)
	}
	defer func() { _ = exec.Command("umount", "-l", dir).Run() }()
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	// A small async buffer, so the journal takes most of the outage, and a
	// 2 MiB journal memory buffer, so the disk and then the memory buffer
	// fill and what is beyond both is dropped.
	lim, err := e.StartLimiter(ctx, b, rd, dir, "FLOODGATE_JOURNAL_SEGMENT_BYTES=262144", "FLOODGATE_JOURNAL_RESERVE_BYTES=262144",
		"FLOODGATE_JOURNAL_MEMORY_BYTES=2097152", "FLOODGATE_LIMITER_EVENT_BUFFER=1000")
	if err != nil {
		return err
	}
	ps := users("jd", s.Principals)
	load := roundRobin(lim.Addr, s.Rate, ps)
	down, up, err := outage(ctx, startLoad(ctx, load), "broker", s.Before, max(s.Outage, 10*time.Second), s.After, b.Kill9, b.Start)
	if err != nil {
		return err
	}
	if err := waitFor(ctx, 2*time.Minute, "journal drained", func() error {
		v, err := lim.Metric(ctx, "floodgate_stream_journal_pending")
		if err == nil && v > 0 {
			err = fmt.Errorf("%v pending", v)
		}
		return err
	}); err != nil {
		return err
	}
	dropped, _ := lim.Metric(ctx, "floodgate_stream_journal_dropped_total")
	capDropped, _ := lim.Metric(ctx, `floodgate_stream_journal_dropped_total{journal="decisions",reason="cap"}`)
	memDropped, _ := lim.Metric(ctx, `floodgate_stream_journal_dropped_total{journal="decisions",reason="memory_full"}`)
	asyncDropped, _ := lim.Metric(ctx, "floodgate_stream_async_dropped_total")
	journaled, _ := lim.Metric(ctx, "floodgate_stream_journaled_total")
	if err := lim.Stop(30 * time.Second); err != nil {
		return err
	}
	counts := map[string]int{}
	if _, err := b.ReadAll(ctx, config.DefaultDecisionsTopic, func(m kafka.Message) { counts[Header(m, "ce_id")]++ }); err != nil {
		return err
	}
	checks := load.Results()
	acked, lost := ackedLost(checks, counts)
	during := Summarise(checks, down, up)
	errLines, _, err := countLines(lim.LogPath, down, `"level":"ERROR"`)
	if err != nil {
		return err
	}
	minutes := time.Since(down).Minutes()
	r.metric("outage", "%.0f s with the journal on a 4 MiB disk", up.Sub(down).Seconds())
	r.metric("limiter during the outage", "%d checks, %s answered, p99 %s", during.Sent, during.Availability(), ms(during.P99))
	r.metric("events", "%d answered 200; %.0f journaled; %d not in Kafka; counted as dropped: %.0f by the journal (%.0f cap, %.0f memory_full), %.0f by the async buffer",
		acked, journaled, lost, dropped, capDropped, memDropped, asyncDropped)
	r.metric("error lines", "%d in %.1f min", errLines, minutes)
	r.require("answered throughout", during.Sent > 0 && during.Answered*100 >= during.Sent*99, "%s", during.Availability())
	// The async buffer's drops include the events it handed to the journal:
	// what is lost is what the journal dropped.
	r.require("every lost event counted by the journal", float64(lost) <= dropped, "%d lost, %.0f counted", lost, dropped)
	r.require("at most 10 error lines a minute", float64(errLines) <= 10*max(minutes, 1), "%d in %.1f min", errLines, minutes)
	return nil
}
