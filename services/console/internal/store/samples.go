package store

import (
	"context"
	"net/netip"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkascan"
)

// Sample is one of the principal's decision events, read from the decisions
// topic around the event that crossed a detection's threshold. The client
// address is cut to its /24 (IPv4) or /64 (IPv6), as the detector stores IPs.
type Sample struct {
	Partition int
	Offset    int64
	TS        time.Time // the decision's ts
	Method    string
	Route     string
	Allowed   bool
	Shadow    bool
	Tier      string
	Priority  string // the request's priority bucket ("" from a limiter before priorities)
	Shed      bool   // refused by priority shedding, not by a limit
	Network   string // the client's /24 or /64, never the full address
	Gateway   string
	Crossing  bool // the event that crossed the threshold
}

// Why a sample list is empty.
const (
	SamplesExpired    = "expired"    // the offset is older than the partition's log start (retention)
	SamplesBeyondEnd  = "beyond_end" // the offset is past the partition's end (the topic was recreated?)
	SamplesNone       = "none"       // the scanned range has none of the principal's decisions
	SamplesOtherTopic = "other_topic"
)

// SampleResult is what SampleReader.Read found.
type SampleResult struct {
	Samples   []Sample // newest first
	Scanned   int      // messages read
	Skipped   int      // the principal's messages that did not decode as decision.v1
	LogStart  int64    // the partition's first offset
	Limited   bool     // the scan stopped at MaxScan before the partition's start
	EmptyWhy  string   // one of Samples* when Samples is empty
	FromTopic string
}

// SampleReader reads a principal's decision events backwards from an offset
// of the decisions topic with kafka-go: the topic is keyed by principal, so
// they are all in that partition. Every read is bounded (MaxScan messages,
// Timeout). Safe for concurrent use.
type SampleReader struct {
	Client  *kafka.Client
	Topic   string        // the decisions topic; references to other topics are not read
	MaxScan int           // messages read at most (2000)
	Keep    int           // samples kept at most (20)
	Chunk   int           // messages per backward step (500)
	Timeout time.Duration // for the whole read (3 s)
}

func (r *SampleReader) limits() (maxScan, keep, chunk int, timeout time.Duration) {
	maxScan, keep, chunk, timeout = r.MaxScan, r.Keep, r.Chunk, r.Timeout
	if maxScan <= 0 {
		maxScan = 2000
	}
	if keep <= 0 {
		keep = 20
	}
	if chunk <= 0 {
		chunk = 500
	}
	if timeout <= 0 {
		timeout = 3 * time.Second
	}
	return maxScan, keep, chunk, timeout
}

// Read returns up to Keep of principal's decisions at or before ref, newest
// first. An error means the broker could not be read; an empty list with a
// reason is an answer.
func (r *SampleReader) Read(ctx context.Context, ref events.EventRef, principal string) (SampleResult, error) {
	maxScan, keep, chunk, timeout := r.limits()
	res := SampleResult{FromTopic: ref.Topic}
	if ref.Topic != r.Topic {
		res.EmptyWhy = SamplesOtherTopic
		return res, nil
	}
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	part := int(ref.Partition)
	first, end, err := kafkascan.Bounds(ctx, r.Client, r.Topic, part)
	if err != nil {
		return res, err
	}
	res.LogStart = first
	switch {
	case ref.Offset < first:
		res.EmptyWhy = SamplesExpired
		return res, nil
	case ref.Offset >= end:
		res.EmptyWhy = SamplesBeyondEnd
		return res, nil
	}
	to := ref.Offset + 1 // exclusive
	for to > first && len(res.Samples) < keep {
		if res.Scanned >= maxScan {
			res.Limited = true
			break
		}
		from := max(to-int64(min(chunk, maxScan-res.Scanned)), first)
		var step []Sample
		err := kafkascan.Scan(ctx, r.Client, r.Topic, part, from, to, func(m kafka.Message) bool {
			res.Scanned++
			if string(m.Key) != principal {
				return true
			}
			d, err := events.DecodeDecision(m.Value)
			if err != nil || d.Principal.Key() != principal {
				res.Skipped++
				return true
			}
			step = append(step, Sample{Partition: part, Offset: m.Offset, TS: d.TS, Method: d.Method, Route: d.Route,
				Allowed: d.Allowed, Shadow: d.Shadow, Tier: string(d.Tier), Priority: string(d.Priority), Shed: d.Shed, Network: TruncateIP(d.IP).String(),
				Gateway: d.Gateway, Crossing: m.Offset == ref.Offset})
			return true
		})
		if err != nil {
			return res, err
		}
		for i := len(step) - 1; i >= 0 && len(res.Samples) < keep; i-- {
			res.Samples = append(res.Samples, step[i])
		}
		to = from
	}
	if len(res.Samples) == 0 {
		res.EmptyWhy = SamplesNone
	}
	return res, nil
}

// TruncateIP cuts ip to its /24 (IPv4) or /64 (IPv6) network address, as the
// detector does before it stores an address.
func TruncateIP(ip netip.Addr) netip.Addr {
	ip = ip.Unmap()
	bits := 64
	if ip.Is4() {
		bits = 24
	}
	p, err := ip.Prefix(bits)
	if err != nil {
		return netip.Addr{}
	}
	return p.Addr()
}
