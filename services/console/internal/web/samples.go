package web

import (
	"context"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// SampleSource reads a principal's decision events around a detection's
// crossing event (store.SampleReader on the decisions topic). Implementations
// must bound the read and be safe for concurrent use.
type SampleSource interface {
	Read(ctx context.Context, ref events.EventRef, principal string) (store.SampleResult, error)
}

var _ SampleSource = (*store.SampleReader)(nil)

// samplesView is the alert page's "Sample events" section.
type samplesView struct {
	Configured bool
	Ref        *events.EventRef // nil: the record names no crossing event
	Result     store.SampleResult
	Error      string
	Empty      string // why the list is empty, in words
}

var emptySamples = map[string]string{
	store.SamplesExpired:    "No sample events: they are older than the decisions topic's retention (the partition now starts at a later offset).",
	store.SamplesBeyondEnd:  "No sample events: the offset is past the end of the partition (was the topic recreated?).",
	store.SamplesNone:       "No sample events: none of this principal's decisions were found in the messages scanned.",
	store.SamplesOtherTopic: "No sample events: the detection was read from another topic than the console's decisions topic.",
}

// loadSamples reads the alert's sample events; a broker failure becomes an
// error message on that section, never a failed page.
func (s *Server) loadSamples(ctx context.Context, a store.Alert) samplesView {
	v := samplesView{Configured: s.cfg.Samples != nil}
	if a.Event != nil {
		v.Ref = a.Event.Evidence.CrossingEvent
	}
	if !v.Configured || v.Ref == nil {
		return v
	}
	res, err := s.cfg.Samples.Read(ctx, *v.Ref, a.Principal)
	v.Result = res
	if err != nil {
		s.cfg.Log.Warn("read sample events", "principal", a.Principal, "topic", v.Ref.Topic, "partition", v.Ref.Partition,
			"offset", v.Ref.Offset, "err", err)
		v.Error = "Sample events could not be read from Kafka: " + err.Error()
		return v
	}
	if len(res.Samples) == 0 {
		v.Empty = emptySamples[res.EmptyWhy]
	}
	return v
}
