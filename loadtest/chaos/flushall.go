package chaos

import (
	"context"
	"fmt"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
)

// RedisFlushAll: rapid-fire bots are penalized, they stop, and Redis loses
// everything (FLUSHALL, as a restart without persistence or a failover that
// dropped writes would). With nothing left to re-detect them from, every
// penalty must come back from the detector's memory within 5 s (issue 21:
// on main penalized bots lost their penalty until re-detected).
func RedisFlushAll(ctx context.Context, e *Env, s Size, r *Result) error {
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return err
	}
	group := fmt.Sprintf("chaos-detector-%d", time.Now().UnixNano())
	if _, err := e.StartDetector(ctx, b, rd, group, closedURL()); err != nil {
		return err
	}
	const nBots = 10
	bots := make([]events.Principal, nBots)
	for i := range bots {
		bots[i] = events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("fa_bot_%d_%d", time.Now().UnixNano(), i)}
	}
	writer := b.Writer()
	defer writer.Close()
	seq := 0
	rc := rd.Client()
	defer rc.Close()
	penalized := func() int {
		n := 0
		for _, bot := range bots {
			if c, _ := rc.Exists(ctx, redisx.PenaltyKey(string(bot.Kind), bot.ID)).Result(); c == 1 {
				n++
			}
		}
		return n
	}
	// 200/s each against a limit of 50/s until every bot is penalized.
	deadline := time.Now().Add(30 * time.Second)
	for penalized() < nBots && time.Now().Before(deadline) {
		var batch []kafka.Message
		for _, bot := range bots {
			for range 20 {
				seq++
				batch = append(batch, ScriptedDecision(bot, "/channels/{channel_id}/messages", seq))
			}
		}
		if err := b.Produce(ctx, writer, config.DefaultDecisionsTopic, batch); err != nil {
			return err
		}
		_ = sleep(ctx, 100*time.Millisecond)
	}
	before := penalized()
	_ = sleep(ctx, 2*time.Second) // the bots have stopped; markers are in place
	if err := rc.FlushAll(ctx).Err(); err != nil {
		return err
	}
	flushed := time.Now()
	var back time.Duration = -1
	_ = waitFor(ctx, 20*time.Second, "penalties re-asserted", func() error {
		if n := penalized(); n < before {
			return fmt.Errorf("%d of %d back", n, before)
		}
		back = time.Since(flushed)
		return nil
	})
	r.metric("penalized before the flush", "%d of %d bots", before, nBots)
	r.metric("after FLUSHALL", "%d of %d penalties back %.1f s after it (the bots had stopped: no re-detection)", penalized(), before, back.Seconds())
	r.require("every bot penalized before the flush", before == nBots, "%d of %d", before, nBots)
	r.require("penalties back within 5 s", back >= 0 && back <= 5*time.Second, "%.1f s", back.Seconds())
	return nil
}
