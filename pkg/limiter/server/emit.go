package server

import (
	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// Appender is a Publisher that copies what it keeps: once TryAppend
// returns, msg's slices are the caller's again, so Emit encodes every event
// into buffers it reuses and a decision event allocates nothing
// (journal.DurableProducer is one; it forms Kafka record batches right
// there). Must be safe for concurrent use and never block.
type Appender interface {
	Publisher
	TryAppend(msg kafka.Message) bool
}

// eventScratch is what Emit encodes one event into, reused across events.
type eventScratch struct {
	value, key, id, ts []byte
	headers            [6]kafka.Header
}

// newScratch returns a scratch with the headers every decision event of s
// carries already set (stream.CloudEventHeaders' order).
func (s *Server) newScratch() *eventScratch {
	sc := &eventScratch{value: make([]byte, 0, 1024), key: make([]byte, 0, 64), id: make([]byte, 0, 36), ts: make([]byte, 0, len(events.TimeLayout))}
	sc.headers = [6]kafka.Header{
		{Key: stream.HeaderCEID},
		{Key: stream.HeaderCEType, Value: []byte(events.CETypeDecision)},
		{Key: stream.HeaderCESource, Value: []byte("floodgate/limiter/" + s.gateway)},
		{Key: stream.HeaderCETime},
		{Key: stream.HeaderCESpecVersion, Value: []byte("1.0")},
		{Key: stream.HeaderContentType, Value: []byte("application/json")},
	}
	return sc
}

// emitAppend is Emit through an Appender: the same message, built in a
// reused scratch.
func (s *Server) emitAppend(a Appender, ev *events.Decision) {
	sc, _ := s.scratch.Get().(*eventScratch)
	if sc == nil {
		sc = s.newScratch()
	}
	defer s.scratch.Put(sc)
	if s.trusted {
		// Not validated again: every decision event is the limiter's own,
		// valid by construction (DecisionEvent, envoyrls' envoyDecision),
		// and validating it was a third of its encoding.
		sc.value = events.AppendDecisionUnchecked(sc.value[:0], ev)
	} else {
		value, err := events.AppendDecision(sc.value[:0], ev)
		if err != nil { // an invalid gateway name (Config.Gateway)
			s.metrics.errors.WithLabelValues("encode").Inc()
			s.log.Error("encode decision", "id", ev.ID, "err", err)
			return
		}
		sc.value = value
	}
	sc.key = append(append(append(sc.key[:0], ev.Principal.Kind...), ':'), ev.Principal.ID...)
	sc.id = append(sc.id[:0], ev.ID...)
	sc.ts = events.AppendTime(sc.ts[:0], ev.TS)
	sc.headers[0].Value, sc.headers[3].Value = sc.id, sc.ts
	a.TryAppend(kafka.Message{Topic: s.topic, Key: sc.key, Value: sc.value, Headers: sc.headers[:], Time: ev.TS})
	// never blocks; a full buffer is counted by the publisher
}
