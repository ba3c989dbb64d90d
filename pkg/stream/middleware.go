package stream

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"runtime/debug"
	"time"

	"github.com/cenkalti/backoff/v5"
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/tick"
)

// The middleware every handler runs inside, written once for both modes and
// composed once per consumer (Watermill's HandlerMiddleware shape): an
// invocation is one message (per-message mode) or one partition's batch
// (batch mode). From the outside in: retries with backoff; per attempt, the
// handle-time histogram, the "process" span (tracing on), the
// ConsumerConfig.Middleware, panic recovery; then the handler. handleUnit
// settles what the chain returns: the outcome counters, and a dead letter
// per message with the error class and reason in its headers.

// Invocation is one call of the handler: one message, or one partition's
// batch in offset order; one attempt.
type Invocation struct {
	Topic, Group string
	Partition    int
	Messages     []kafka.Message // the caller owns them: middleware must not modify them
	Attempt      int             // 1-based

	started      time.Time   // of the latest attempt
	firstFailure time.Time   // of the first failed attempt
	rejected     []rejection // the batch handler's refusals, of the latest attempt
}

// HandlerFunc calls the handler, or the next middleware, on inv.
type HandlerFunc func(ctx context.Context, inv *Invocation) error

// HandlerMiddleware wraps a HandlerFunc: it may change the context, watch
// the error, or call next more than once (Watermill's shape).
type HandlerMiddleware func(next HandlerFunc) HandlerFunc

// rejection is one message of a batch the handler refused permanently.
type rejection struct {
	index int
	err   error
}

// compose builds the consumer's chain around inner, once.
func (c *Consumer) compose(inner HandlerFunc) HandlerFunc {
	h := recovered(inner)
	for i := len(c.cfg.Middleware) - 1; i >= 0; i-- {
		h = c.cfg.Middleware[i](h)
	}
	if c.tracer != nil {
		h = c.tracer.processing(h)
	}
	return c.retried(c.timed(h))
}

// handleUnit runs msgs (one partition's, in offset order) through the chain
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
//   - any other error: retried (see retried), then every message is
//     dead-lettered as transient_exhausted.
func (c *Consumer) handleUnit(hctx context.Context, msgs []kafka.Message) bool {
	inv := &Invocation{Topic: c.cfg.Topic, Group: c.cfg.GroupID, Partition: msgs[0].Partition, Messages: msgs, Attempt: 1}
	err := c.call(hctx, inv)
	if err == nil {
		firstFailure := cmp.Or(inv.firstFailure, inv.started)
		for _, rj := range inv.rejected {
			if !c.deadLetter(hctx, msgs[rj.index], newDLQRecord(c, msgs[rj.index], classify(rj.err), rj.err, inv.Attempt, firstFailure)) {
				return false
			}
		}
		n := float64(len(msgs) - len(inv.rejected))
		if inv.Attempt == 1 {
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
	class := ClassTransientExhausted
	if final(err) {
		class = classify(err)
		if perr := (*panicError)(nil); errors.As(err, &perr) {
			c.log.Error("handler panicked", "partition", msgs[0].Partition, "offset", msgs[0].Offset,
				"messages", len(msgs), "panic", fmt.Sprint(perr.value), "stack", string(perr.stack))
		}
	}
	for _, m := range msgs {
		if !c.deadLetter(hctx, m, newDLQRecord(c, m, class, err, inv.Attempt, inv.firstFailure)) {
			return false
		}
	}
	return true
}

// final reports whether err must not be retried: permanent, or a panic.
func final(err error) bool { return IsPermanent(err) || classify(err) == ClassHandlerPanic }

// retried calls next again with exponential, jittered backoff while it fails
// with an error that may pass (not permanent, not a panic), up to
// MaxAttempts in all, and returns its last error; it stops early, returning
// that error, when ctx ends (the drain or rebalance deadline).
func (c *Consumer) retried(next HandlerFunc) HandlerFunc {
	return func(ctx context.Context, inv *Invocation) error {
		var bo *backoff.ExponentialBackOff
		for ; ; inv.Attempt++ {
			err := next(ctx, inv)
			if err == nil {
				return nil
			}
			if inv.firstFailure.IsZero() {
				inv.firstFailure = inv.started
			}
			if ctx.Err() != nil || final(err) || inv.Attempt >= c.cfg.MaxAttempts {
				return err
			}
			c.retryCount.Inc()
			if bo == nil {
				bo = c.newBackoff()
			}
			wait := min(bo.NextBackOff(), c.cfg.MaxBackoff)
			c.log.Debug("handler failed; retrying", "partition", inv.Partition, "offset", inv.Messages[0].Offset,
				"messages", len(inv.Messages), "attempt", inv.Attempt, "backoff", wait, "err", err)
			if !tick.Sleep(ctx, wait) {
				return err
			}
		}
	}
}

// timed observes each attempt's duration in the handle-time histogram.
func (c *Consumer) timed(next HandlerFunc) HandlerFunc {
	return func(ctx context.Context, inv *Invocation) error {
		inv.started = time.Now()
		err := next(ctx, inv)
		c.handleSeconds.Observe(time.Since(inv.started).Seconds())
		return err
	}
}

// processing makes each attempt a "process <topic>" consumer span (see
// Tracer.process).
func (t *Tracer) processing(next HandlerFunc) HandlerFunc {
	return func(ctx context.Context, inv *Invocation) (err error) {
		ctx, span := t.process(ctx, inv)
		defer func() { endSpan(span, err) }()
		return next(ctx, inv)
	}
}

// recovered turns a panic in next into a *panicError.
func recovered(next HandlerFunc) HandlerFunc {
	return func(ctx context.Context, inv *Invocation) (err error) {
		defer func() {
			if v := recover(); v != nil {
				inv.rejected, err = nil, &panicError{value: v, stack: debug.Stack()}
			}
		}()
		return next(ctx, inv)
	}
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
