package stream

import (
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/segmentio/kafka-go"
	"go.opentelemetry.io/otel/trace"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// The middleware every handler runs inside, written once for both modes: a
// unit is one message (per-message mode) or one partition's batch (batch
// mode). Around each attempt: the trace hook and panic recovery; after it:
// the handle-time histogram and the outcome counters; on failure: retries
// with backoff, then a dead letter per message with the error class and
// reason in its headers.

// rejection is one message of a batch the handler refused permanently.
type rejection struct {
	index int
	err   error
}

// unitCall invokes the handler on msgs; attempt is 1-based. It returns the
// messages the handler rejected (batch mode) and its error.
type unitCall func(ctx context.Context, msgs []kafka.Message, attempt int) ([]rejection, error)

// handleUnit runs msgs (one partition's, in offset order) through the handler
// until they are handled or dead-lettered, and reports whether they were;
// false means hctx ended first (drain or rebalance deadline) and none of msgs
// may be committed.
//
//   - nil: done; messages the handler rejected are dead-lettered (class from
//     their error: event_time, handler_panic or poison).
//   - a permanent error (Permanent, or a Permanent() bool method): every
//     message is dead-lettered at once as poison (event_time for an
//     *EventTimeError).
//   - a panic: every message is dead-lettered as handler_panic.
//   - any other error: the whole unit is tried again with exponential
//     backoff, up to MaxAttempts, then every message is dead-lettered as
//     transient_exhausted.
func (c *Consumer) handleUnit(hctx context.Context, msgs []kafka.Message, call unitCall) bool {
	var firstFailure time.Time
	var bo *backoff.ExponentialBackOff
	for attempt := 1; ; attempt++ {
		start := time.Now()
		rejected, err := c.invoke(hctx, msgs, attempt, call)
		c.handleSeconds.Observe(time.Since(start).Seconds())
		if err == nil {
			if len(rejected) > 0 && firstFailure.IsZero() {
				firstFailure = start
			}
			for _, rj := range rejected {
				if !c.deadLetter(hctx, msgs[rj.index], newDLQRecord(c, msgs[rj.index], classify(rj.err), rj.err, attempt, firstFailure)) {
					return false
				}
			}
			n := float64(len(msgs) - len(rejected))
			if attempt == 1 {
				c.okCount.Add(n)
			} else {
				c.retriedCount.Add(n)
			}
			return true
		}
		if hctx.Err() != nil {
			// The drain deadline passed; the failure may be the cancellation.
			c.log.Warn("handler stopped by the drain or rebalance deadline; left for redelivery",
				"partition", msgs[0].Partition, "offset", msgs[0].Offset, "messages", len(msgs), "err", err)
			return false
		}
		if firstFailure.IsZero() {
			firstFailure = start
		}
		var class ErrorClass
		switch {
		case IsPermanent(err) || classify(err) == ClassHandlerPanic:
			class = classify(err)
			if perr := (*panicError)(nil); errors.As(err, &perr) {
				c.log.Error("handler panicked", "partition", msgs[0].Partition, "offset", msgs[0].Offset,
					"messages", len(msgs), "panic", fmt.Sprint(perr.value), "stack", string(perr.stack))
			}
		case attempt < c.cfg.MaxAttempts:
			c.retryCount.Inc()
			if bo == nil {
				bo = c.newBackoff()
			}
			wait := min(bo.NextBackOff(), c.cfg.MaxBackoff)
			c.log.Debug("handler failed; retrying", "partition", msgs[0].Partition, "offset", msgs[0].Offset,
				"messages", len(msgs), "attempt", attempt, "backoff", wait, "err", err)
			if !tick.Sleep(hctx, wait) {
				return false
			}
			continue
		default:
			class = ClassTransientExhausted
		}
		for _, m := range msgs {
			if !c.deadLetter(hctx, m, newDLQRecord(c, m, class, err, attempt, firstFailure)) {
				return false
			}
		}
		return true
	}
}

// invoke calls the handler inside its process span (tracing on) and through
// the trace hook, turning a panic into an error.
func (c *Consumer) invoke(ctx context.Context, msgs []kafka.Message, attempt int, call unitCall) (rejected []rejection, err error) {
	if c.tracer != nil {
		var span trace.Span
		ctx, span = c.tracer.process(ctx, &c.cfg, msgs, attempt)
		defer func() { endSpan(span, err) }()
	}
	if c.cfg.TraceHook != nil {
		var end func(error)
		ctx, end = c.cfg.TraceHook(ctx, Invocation{
			Topic: c.cfg.Topic, Group: c.cfg.GroupID, Partition: msgs[0].Partition,
			FirstOffset: msgs[0].Offset, LastOffset: msgs[len(msgs)-1].Offset, Messages: len(msgs), Attempt: attempt,
		})
		defer func() { end(err) }()
	}
	defer func() {
		if v := recover(); v != nil {
			rejected, err = nil, &panicError{value: v, stack: debug.Stack()}
		}
	}()
	return call(ctx, msgs, attempt)
}

// newDLQRecord describes msg failing with err.
func newDLQRecord(c *Consumer, msg kafka.Message, class ErrorClass, err error, attempts int, firstFailure time.Time) DLQRecord {
	return DLQRecord{
		Key:           msg.Key,
		Value:         msg.Value,
		Headers:       msg.Headers,
		SourceTopic:   c.cfg.Topic,
		Partition:     msg.Partition,
		Offset:        msg.Offset,
		Timestamp:     msg.Time,
		ConsumerGroup: c.cfg.GroupID,
		Service:       c.cfg.Service,
		ErrorClass:    class,
		ErrorMessage:  err.Error(),
		Attempts:      attempts,
		FirstFailure:  firstFailure,
	}
}

// deadLetter publishes rec to the DLQ, retrying until it succeeds or ctx ends;
// it reports whether it succeeded. A record over MaxMessageBytes is written
// as a reference (see DLQRecord.asReference).
func (c *Consumer) deadLetter(ctx context.Context, msg kafka.Message, rec DLQRecord) bool {
	out := rec.Message(c.cfg.DLQTopic)
	if messageBytes(out) > c.cfg.MaxMessageBytes {
		rec = rec.asReference()
		out = rec.Message(c.cfg.DLQTopic)
	}
	var bo *backoff.ExponentialBackOff
	for {
		err := c.dlq.Publish(ctx, out)
		if err == nil {
			c.dlqCount.Inc()
			c.metrics.dlq.WithLabelValues(c.cfg.Topic, string(rec.ErrorClass)).Inc()
			c.dlqLog.record(msg.Partition, msg.Offset, c.cfg.DLQTopic, rec.ErrorClass, rec.Attempts,
				truncateUTF8(rec.ErrorMessage, MaxDLQErrorMessageBytes))
			return true
		}
		c.dlqPublishErrs.Inc()
		if bo == nil {
			bo = c.newBackoff()
		}
		wait := min(bo.NextBackOff(), c.cfg.MaxBackoff)
		c.log.Error("publish to dlq failed; retrying", "partition", msg.Partition, "offset", msg.Offset,
			"dlq_topic", c.cfg.DLQTopic, "backoff", wait, "err", err)
		if !tick.Sleep(ctx, wait) {
			c.log.Error("dlq publish abandoned at the drain or rebalance deadline; message left for redelivery",
				"partition", msg.Partition, "offset", msg.Offset)
			return false
		}
	}
}
