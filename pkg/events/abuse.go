package events

import (
	"fmt"
	"math"
	"net/netip"
	"strconv"
	"time"
)

// Abuse is an abuse.v1 event: one per detection.
type Abuse struct {
	// ID is unique per event: 1–64 characters of [A-Za-z0-9_-].
	ID string
	// DetectedAt is when the detector decided.
	DetectedAt time.Time
	Principal  Principal
	Pattern    Pattern
	Severity   Severity
	// Score is the detector's score, >= 0; higher is worse.
	Score float64
	// Window is the time window the evidence covers.
	Window Window
	// FirstEventAt is the timestamp of the first event that counted towards
	// the detection (detection latency = DetectedAt - FirstEventAt).
	FirstEventAt time.Time
	Evidence     Evidence
	Penalty      Penalty
	// DetectorVersion identifies the detector build or model, 1–64 characters.
	DetectorVersion string
	// IncidentID, when set, groups the detections of one incident: one
	// principal × pattern while its penalty runs (optional; empty: absent).
	IncidentID string
	// DetectionCount is this detection's number within its incident, from 1
	// (optional; 0: absent).
	DetectionCount int64
}

// Window is the time window of a detection.
type Window struct {
	Start time.Time
	End   time.Time
	// Seconds is the window's length, >= 1.
	Seconds int64
}

// Evidence is what a detection is based on.
type Evidence struct {
	// ObservedRate is the principal's rate in events per second, >= 0.
	ObservedRate float64
	// BaselineRate is the expected rate in events per second, >= 0.
	BaselineRate float64
	// Threshold is the rate (events per second) above which the pattern fires, >= 0.
	Threshold float64
	// EventCount is the number of events in the window, >= 1.
	EventCount int64
	// DistinctIPs, DistinctIP24 and DistinctIP64 count the distinct client
	// addresses, IPv4 /24 networks and IPv6 /64 networks in the window.
	DistinctIPs  int64
	DistinctIP24 int64
	DistinctIP64 int64
	// TopRoutes are the busiest routes, at most 10, busiest first.
	TopRoutes []RouteCount
	// TopIPs are the busiest client addresses, at most 10, busiest first.
	TopIPs []IPCount
	// CrossingEvent, when set, is where the decision event that crossed the
	// threshold was read (optional: absent in events of older detectors).
	CrossingEvent *EventRef
	// Basis, when set, is what the principal was measured against (optional:
	// absent in events of older detectors).
	Basis *Basis
}

// Basis is what a detection measured the principal against, per pattern.
type Basis struct {
	// Source is the expectation: principal_history, route_population,
	// kind_floor or limit (rapid_fire), or networks (distributed_ip).
	Source string
	// BaselineKind is the kind whose baselines and floors were used.
	BaselineKind PrincipalKind
	// DenialRatio is the share of the principal's decisions in about one
	// window that the limiter denied, 0–1.
	DenialRatio float64
	// NewNetworks counts networks new to the principal in the fan-out
	// interval; NetworkThreshold is the count of networks at which
	// distributed_ip fires (0 for other patterns).
	NewNetworks      int64
	NetworkThreshold int64
}

// Basis sources.
const (
	BasisPrincipalHistory = "principal_history"
	BasisRoutePopulation  = "route_population"
	BasisKindFloor        = "kind_floor"
	BasisLimit            = "limit"
	BasisNetworks         = "networks"
)

const basisSources = "principal_history|route_population|kind_floor|limit|networks"

func (b *Basis) validate() *ValidationError {
	if err := oneOf(b.Source, basisSources); err != nil {
		return at("source", err)
	}
	if !b.BaselineKind.Valid() {
		return at("baseline_kind", oneOf(string(b.BaselineKind), principalKinds))
	}
	if err := atLeast0(b.DenialRatio); err != nil || b.DenialRatio > 1 {
		return at("denial_ratio", reason(fmt.Sprintf("%v is not in [0, 1]", b.DenialRatio)))
	}
	if err := intRange(b.NewNetworks, 0, MaxSafeInteger); err != nil {
		return at("new_networks", err)
	}
	if err := intRange(b.NetworkThreshold, 0, MaxSafeInteger); err != nil {
		return at("network_threshold", err)
	}
	return nil
}

// EventRef names one Kafka message: a topic, a partition and an offset.
type EventRef struct {
	// Topic is a Kafka topic name: 1–249 characters of [A-Za-z0-9._-].
	Topic string
	// Partition is the partition, 0–2147483647.
	Partition int32
	// Offset is the message's offset in the partition, 0–2^53-1.
	Offset int64
}

// MaxTopicLen is the longest Kafka topic name.
const MaxTopicLen = 249

// ValidTopic reports whether s is a Kafka topic name: 1–249 characters of
// [A-Za-z0-9._-].
func ValidTopic(s string) error { return asError(validTopic(s)) }

func validTopic(s string) *ValidationError {
	if s == "" {
		return reason("must not be empty")
	}
	if len(s) > MaxTopicLen {
		return reason(fmt.Sprintf("%s is %d characters long, the limit is %d", quote(s), len(s), MaxTopicLen))
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !isIDByte(c) && c != '.' {
			return reason(fmt.Sprintf("%s has %s at byte %d; allowed are A-Z a-z 0-9 . _ -", quote(s), quoteRuneAt(s, i), i))
		}
	}
	return nil
}

func (r *EventRef) validate() *ValidationError {
	if err := validTopic(r.Topic); err != nil {
		return at("topic", err)
	}
	if err := intRange(int64(r.Partition), 0, math.MaxInt32); err != nil {
		return at("partition", err)
	}
	if err := intRange(r.Offset, 0, MaxSafeInteger); err != nil {
		return at("offset", err)
	}
	return nil
}

// RouteCount is one of Evidence.TopRoutes.
type RouteCount struct {
	Route string
	// Count is the number of events on Route, >= 1.
	Count int64
}

// IPCount is one of Evidence.TopIPs.
type IPCount struct {
	IP netip.Addr
	// Count is the number of events from IP, >= 1.
	Count int64
	// SharedPrincipals is how many other principals used IP in the window:
	// a high number marks NAT or a proxy.
	SharedPrincipals int64
}

// Penalty is the penalty a detection applied (or, simulated, would have).
type Penalty struct {
	// Multiplier scales the principal's limits, in (0, 1].
	Multiplier float64
	ExpiresAt  time.Time
	// Level is the escalation level, >= 1.
	Level int64
	Mode  PenaltyMode
}

// CETypeAbuse is the CloudEvents ce_type of abuse.v1.
const CETypeAbuse = "dev.floodgate." + TypeAbuse

// Validate checks a against the abuse.v1 contract.
func (a *Abuse) Validate() error { return withType(TypeAbuse, a.validate()) }

func (a *Abuse) validate() *ValidationError {
	if err := validID(a.ID); err != nil {
		return at("id", err)
	}
	if err := validTime(a.DetectedAt); err != nil {
		return at("detected_at", err)
	}
	if err := a.Principal.validate(); err != nil {
		return at("principal", err)
	}
	if !a.Pattern.Valid() {
		return at("pattern", oneOf(string(a.Pattern), patterns))
	}
	if !a.Severity.Valid() {
		return at("severity", oneOf(string(a.Severity), severities))
	}
	if err := atLeast0(a.Score); err != nil {
		return at("score", err)
	}
	if err := a.Window.validate(); err != nil {
		return at("window", err)
	}
	if err := validTime(a.FirstEventAt); err != nil {
		return at("first_event_at", err)
	}
	if err := a.Evidence.validate(); err != nil {
		return at("evidence", err)
	}
	if err := a.Penalty.validate(); err != nil {
		return at("penalty", err)
	}
	if err := validText(a.DetectorVersion, MaxVersionLen, false); err != nil {
		return at("detector_version", err)
	}
	if a.IncidentID != "" {
		if err := validID(a.IncidentID); err != nil {
			return at("incident_id", err)
		}
	}
	if a.DetectionCount != 0 {
		if err := intRange(a.DetectionCount, 1, MaxSafeInteger); err != nil {
			return at("detection_count", err)
		}
	}
	return nil
}

func (w *Window) validate() *ValidationError {
	if err := validTime(w.Start); err != nil {
		return at("start", err)
	}
	if err := validTime(w.End); err != nil {
		return at("end", err)
	}
	if err := intRange(w.Seconds, 1, MaxSafeInteger); err != nil {
		return at("seconds", err)
	}
	return nil
}

func (e *Evidence) validate() *ValidationError {
	if err := atLeast0(e.ObservedRate); err != nil {
		return at("observed_rate", err)
	}
	if err := atLeast0(e.BaselineRate); err != nil {
		return at("baseline_rate", err)
	}
	if err := atLeast0(e.Threshold); err != nil {
		return at("threshold", err)
	}
	if err := intRange(e.EventCount, 1, MaxSafeInteger); err != nil {
		return at("event_count", err)
	}
	if err := intRange(e.DistinctIPs, 0, MaxSafeInteger); err != nil {
		return at("distinct_ips", err)
	}
	if err := intRange(e.DistinctIP24, 0, MaxSafeInteger); err != nil {
		return at("distinct_ip24", err)
	}
	if err := intRange(e.DistinctIP64, 0, MaxSafeInteger); err != nil {
		return at("distinct_ip64", err)
	}
	if len(e.TopRoutes) > MaxTopItems {
		return at("top_routes", tooMany(len(e.TopRoutes)))
	}
	for i := range e.TopRoutes {
		if err := e.TopRoutes[i].validate(); err != nil {
			return at("top_routes["+strconv.Itoa(i)+"]", err)
		}
	}
	if len(e.TopIPs) > MaxTopItems {
		return at("top_ips", tooMany(len(e.TopIPs)))
	}
	for i := range e.TopIPs {
		if err := e.TopIPs[i].validate(); err != nil {
			return at("top_ips["+strconv.Itoa(i)+"]", err)
		}
	}
	if e.CrossingEvent != nil {
		if err := e.CrossingEvent.validate(); err != nil {
			return at("crossing_event", err)
		}
	}
	if e.Basis != nil {
		if err := e.Basis.validate(); err != nil {
			return at("basis", err)
		}
	}
	return nil
}

func tooMany(n int) *ValidationError {
	return reason("has " + strconv.Itoa(n) + " items, the limit is " + strconv.Itoa(MaxTopItems))
}

func (r *RouteCount) validate() *ValidationError {
	if err := validRoute(r.Route); err != nil {
		return at("route", err)
	}
	if err := intRange(r.Count, 1, MaxSafeInteger); err != nil {
		return at("count", err)
	}
	return nil
}

func (c *IPCount) validate() *ValidationError {
	if err := validAddr(c.IP); err != nil {
		return at("ip", err)
	}
	if err := intRange(c.Count, 1, MaxSafeInteger); err != nil {
		return at("count", err)
	}
	if err := intRange(c.SharedPrincipals, 0, MaxSafeInteger); err != nil {
		return at("shared_principals", err)
	}
	return nil
}

func (p *Penalty) validate() *ValidationError {
	if err := multiplier(p.Multiplier); err != nil {
		return at("multiplier", err)
	}
	if err := validTime(p.ExpiresAt); err != nil {
		return at("expires_at", err)
	}
	if err := intRange(p.Level, 1, MaxSafeInteger); err != nil {
		return at("level", err)
	}
	if !p.Mode.Valid() {
		return at("mode", oneOf(string(p.Mode), penaltyModes))
	}
	return nil
}

// EncodeAbuse validates a and encodes it as JSON.
func EncodeAbuse(a *Abuse) ([]byte, error) { return AppendAbuse(make([]byte, 0, 1024), a) }

// AppendAbuse validates a and appends its JSON encoding to dst; on error dst is
// returned unchanged.
func AppendAbuse(dst []byte, a *Abuse) ([]byte, error) {
	if err := a.Validate(); err != nil {
		return dst, err
	}
	b := append(dst, `{"type":"`+TypeAbuse+`","id":`...)
	b = appendString(b, a.ID)
	b = append(b, `,"detected_at":`...)
	b = appendTimeString(b, a.DetectedAt)
	b = append(b, `,"principal":`...)
	b = appendPrincipal(b, a.Principal)
	b = append(b, `,"pattern":`...)
	b = appendString(b, string(a.Pattern))
	b = append(b, `,"severity":`...)
	b = appendString(b, string(a.Severity))
	b = append(b, `,"score":`...)
	b = appendFloat(b, a.Score)
	b = append(b, `,"window":{"start":`...)
	b = appendTimeString(b, a.Window.Start)
	b = append(b, `,"end":`...)
	b = appendTimeString(b, a.Window.End)
	b = append(b, `,"seconds":`...)
	b = strconv.AppendInt(b, a.Window.Seconds, 10)
	b = append(b, `},"first_event_at":`...)
	b = appendTimeString(b, a.FirstEventAt)
	e := &a.Evidence
	b = append(b, `,"evidence":{"observed_rate":`...)
	b = appendFloat(b, e.ObservedRate)
	b = append(b, `,"baseline_rate":`...)
	b = appendFloat(b, e.BaselineRate)
	b = append(b, `,"threshold":`...)
	b = appendFloat(b, e.Threshold)
	b = append(b, `,"event_count":`...)
	b = strconv.AppendInt(b, e.EventCount, 10)
	b = append(b, `,"distinct_ips":`...)
	b = strconv.AppendInt(b, e.DistinctIPs, 10)
	b = append(b, `,"distinct_ip24":`...)
	b = strconv.AppendInt(b, e.DistinctIP24, 10)
	b = append(b, `,"distinct_ip64":`...)
	b = strconv.AppendInt(b, e.DistinctIP64, 10)
	b = append(b, `,"top_routes":[`...)
	for i, r := range e.TopRoutes {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"route":`...)
		b = appendString(b, r.Route)
		b = append(b, `,"count":`...)
		b = strconv.AppendInt(b, r.Count, 10)
		b = append(b, '}')
	}
	b = append(b, `],"top_ips":[`...)
	for i, c := range e.TopIPs {
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"ip":"`...)
		b = c.IP.AppendTo(b)
		b = append(b, `","count":`...)
		b = strconv.AppendInt(b, c.Count, 10)
		b = append(b, `,"shared_principals":`...)
		b = strconv.AppendInt(b, c.SharedPrincipals, 10)
		b = append(b, '}')
	}
	b = append(b, ']')
	if r := e.CrossingEvent; r != nil {
		b = append(b, `,"crossing_event":{"topic":`...)
		b = appendString(b, r.Topic)
		b = append(b, `,"partition":`...)
		b = strconv.AppendInt(b, int64(r.Partition), 10)
		b = append(b, `,"offset":`...)
		b = strconv.AppendInt(b, r.Offset, 10)
		b = append(b, '}')
	}
	if bs := e.Basis; bs != nil {
		b = append(b, `,"basis":{"source":`...)
		b = appendString(b, bs.Source)
		b = append(b, `,"baseline_kind":`...)
		b = appendString(b, string(bs.BaselineKind))
		b = append(b, `,"denial_ratio":`...)
		b = appendFloat(b, bs.DenialRatio)
		b = append(b, `,"new_networks":`...)
		b = strconv.AppendInt(b, bs.NewNetworks, 10)
		b = append(b, `,"network_threshold":`...)
		b = strconv.AppendInt(b, bs.NetworkThreshold, 10)
		b = append(b, '}')
	}
	b = append(b, `},"penalty":{"multiplier":`...)
	b = appendFloat(b, a.Penalty.Multiplier)
	b = append(b, `,"expires_at":`...)
	b = appendTimeString(b, a.Penalty.ExpiresAt)
	b = append(b, `,"level":`...)
	b = strconv.AppendInt(b, a.Penalty.Level, 10)
	b = append(b, `,"mode":`...)
	b = appendString(b, string(a.Penalty.Mode))
	b = append(b, `},"detector_version":`...)
	b = appendString(b, a.DetectorVersion)
	if a.IncidentID != "" {
		b = append(b, `,"incident_id":`...)
		b = appendString(b, a.IncidentID)
	}
	if a.DetectionCount != 0 {
		b = append(b, `,"detection_count":`...)
		b = strconv.AppendInt(b, a.DetectionCount, 10)
	}
	return append(b, '}'), nil
}

// MarshalJSON implements json.Marshaler with EncodeAbuse.
func (a Abuse) MarshalJSON() ([]byte, error) { return EncodeAbuse(&a) }

// UnmarshalJSON implements json.Unmarshaler with DecodeAbuse.
func (a *Abuse) UnmarshalJSON(data []byte) error {
	v, err := DecodeAbuse(data)
	if err != nil {
		return err
	}
	*a = v
	return nil
}

// DecodeAbuse decodes and validates an abuse.v1 event. Every error satisfies
// errors.Is(err, ErrInvalid); the Abuse is zero on error.
func DecodeAbuse(data []byte) (Abuse, error) {
	var ev Abuse
	if err := decodeAbuse(data, &ev); err != nil {
		return Abuse{}, err
	}
	return ev, nil
}

func decodeAbuse(data []byte, ev *Abuse) *ValidationError {
	const (
		bType uint32 = 1 << iota
		bID
		bDetectedAt
		bPrincipal
		bPattern
		bSeverity
		bScore
		bWindow
		bFirstEventAt
		bEvidence
		bPenalty
		bDetectorVersion
		bIncidentID
		bDetectionCount
	)
	d := decoder{data: data, typ: TypeAbuse}
	if err := d.object(""); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "type":
			if err = d.seen(&seen, bType, "type"); err == nil {
				err = d.constant("type", TypeAbuse)
			}
		case "id":
			if err = d.seen(&seen, bID, "id"); err == nil {
				if ev.ID, err = d.str("id"); err == nil {
					if e := validID(ev.ID); e != nil {
						err = d.invalid("id", e)
					}
				}
			}
		case "detected_at":
			if err = d.seen(&seen, bDetectedAt, "detected_at"); err == nil {
				ev.DetectedAt, err = d.time("detected_at")
			}
		case "principal":
			if err = d.seen(&seen, bPrincipal, "principal"); err == nil {
				ev.Principal, err = d.principal()
			}
		case "pattern":
			if err = d.seen(&seen, bPattern, "pattern"); err == nil {
				var s string
				s, err = d.enum("pattern", patterns)
				ev.Pattern = Pattern(s)
			}
		case "severity":
			if err = d.seen(&seen, bSeverity, "severity"); err == nil {
				var s string
				s, err = d.enum("severity", severities)
				ev.Severity = Severity(s)
			}
		case "score":
			if err = d.seen(&seen, bScore, "score"); err == nil {
				if ev.Score, err = d.float("score"); err == nil {
					if e := atLeast0(ev.Score); e != nil {
						err = d.invalid("score", e)
					}
				}
			}
		case "window":
			if err = d.seen(&seen, bWindow, "window"); err == nil {
				err = d.window(&ev.Window)
			}
		case "first_event_at":
			if err = d.seen(&seen, bFirstEventAt, "first_event_at"); err == nil {
				ev.FirstEventAt, err = d.time("first_event_at")
			}
		case "evidence":
			if err = d.seen(&seen, bEvidence, "evidence"); err == nil {
				err = d.evidence(&ev.Evidence)
			}
		case "penalty":
			if err = d.seen(&seen, bPenalty, "penalty"); err == nil {
				err = d.penalty(&ev.Penalty)
			}
		case "detector_version":
			if err = d.seen(&seen, bDetectorVersion, "detector_version"); err == nil {
				if ev.DetectorVersion, err = d.str("detector_version"); err == nil {
					if e := validText(ev.DetectorVersion, MaxVersionLen, false); e != nil {
						err = d.invalid("detector_version", e)
					}
				}
			}
		case "incident_id":
			if err = d.seen(&seen, bIncidentID, "incident_id"); err == nil {
				if ev.IncidentID, err = d.str("incident_id"); err == nil {
					if e := validID(ev.IncidentID); e != nil {
						err = d.invalid("incident_id", e)
					}
				}
			}
		case "detection_count":
			if err = d.seen(&seen, bDetectionCount, "detection_count"); err == nil {
				ev.DetectionCount, err = d.integer("detection_count", 1, MaxSafeInteger)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	if err := d.end(); err != nil {
		return err
	}
	return d.required("", seen, []req{
		{bType, "type"}, {bID, "id"}, {bDetectedAt, "detected_at"}, {bPrincipal, "principal"},
		{bPattern, "pattern"}, {bSeverity, "severity"}, {bScore, "score"}, {bWindow, "window"},
		{bFirstEventAt, "first_event_at"}, {bEvidence, "evidence"}, {bPenalty, "penalty"},
		{bDetectorVersion, "detector_version"},
	})
}

func (d *decoder) window(w *Window) *ValidationError {
	const (
		bStart uint32 = 1 << iota
		bEnd
		bSeconds
	)
	if err := d.object("window"); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "start":
			if err = d.seen(&seen, bStart, "start"); err == nil {
				w.Start, err = d.time("window.start")
			}
		case "end":
			if err = d.seen(&seen, bEnd, "end"); err == nil {
				w.End, err = d.time("window.end")
			}
		case "seconds":
			if err = d.seen(&seen, bSeconds, "seconds"); err == nil {
				w.Seconds, err = d.integer("window.seconds", 1, MaxSafeInteger)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("window", seen, []req{{bStart, "start"}, {bEnd, "end"}, {bSeconds, "seconds"}})
}

func (d *decoder) evidence(e *Evidence) *ValidationError {
	const (
		bObservedRate uint32 = 1 << iota
		bBaselineRate
		bThreshold
		bEventCount
		bDistinctIPs
		bDistinctIP24
		bDistinctIP64
		bTopRoutes
		bTopIPs
		bCrossingEvent
		bBasis
	)
	if err := d.object("evidence"); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "observed_rate":
			if err = d.seen(&seen, bObservedRate, "observed_rate"); err == nil {
				e.ObservedRate, err = d.nonNegative("evidence.observed_rate")
			}
		case "baseline_rate":
			if err = d.seen(&seen, bBaselineRate, "baseline_rate"); err == nil {
				e.BaselineRate, err = d.nonNegative("evidence.baseline_rate")
			}
		case "threshold":
			if err = d.seen(&seen, bThreshold, "threshold"); err == nil {
				e.Threshold, err = d.nonNegative("evidence.threshold")
			}
		case "event_count":
			if err = d.seen(&seen, bEventCount, "event_count"); err == nil {
				e.EventCount, err = d.integer("evidence.event_count", 1, MaxSafeInteger)
			}
		case "distinct_ips":
			if err = d.seen(&seen, bDistinctIPs, "distinct_ips"); err == nil {
				e.DistinctIPs, err = d.integer("evidence.distinct_ips", 0, MaxSafeInteger)
			}
		case "distinct_ip24":
			if err = d.seen(&seen, bDistinctIP24, "distinct_ip24"); err == nil {
				e.DistinctIP24, err = d.integer("evidence.distinct_ip24", 0, MaxSafeInteger)
			}
		case "distinct_ip64":
			if err = d.seen(&seen, bDistinctIP64, "distinct_ip64"); err == nil {
				e.DistinctIP64, err = d.integer("evidence.distinct_ip64", 0, MaxSafeInteger)
			}
		case "top_routes":
			if err = d.seen(&seen, bTopRoutes, "top_routes"); err == nil {
				e.TopRoutes, err = d.topRoutes()
			}
		case "top_ips":
			if err = d.seen(&seen, bTopIPs, "top_ips"); err == nil {
				e.TopIPs, err = d.topIPs()
			}
		case "crossing_event":
			if err = d.seen(&seen, bCrossingEvent, "crossing_event"); err == nil {
				e.CrossingEvent = &EventRef{}
				err = d.eventRef(e.CrossingEvent)
			}
		case "basis":
			if err = d.seen(&seen, bBasis, "basis"); err == nil {
				e.Basis = &Basis{}
				err = d.basis(e.Basis)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("evidence", seen, []req{
		{bObservedRate, "observed_rate"}, {bBaselineRate, "baseline_rate"}, {bThreshold, "threshold"},
		{bEventCount, "event_count"}, {bDistinctIPs, "distinct_ips"}, {bDistinctIP24, "distinct_ip24"},
		{bDistinctIP64, "distinct_ip64"}, {bTopRoutes, "top_routes"}, {bTopIPs, "top_ips"},
	})
}

// nonNegative reads a number >= 0.
func (d *decoder) nonNegative(field string) (float64, *ValidationError) {
	v, err := d.float(field)
	if err == nil {
		if e := atLeast0(v); e != nil {
			return 0, d.invalid(field, e)
		}
	}
	return v, err
}

func (d *decoder) topRoutes() ([]RouteCount, *ValidationError) {
	return topList(d, "evidence.top_routes", (*decoder).routeCount)
}

// topList decodes an evidence array of at most MaxTopItems objects, each by elem.
func topList[T any](d *decoder, field string, elem func(*decoder, *T) *ValidationError) ([]T, *ValidationError) {
	if err := d.array(field); err != nil {
		return nil, err
	}
	var out []T
	first := true
	for i := 0; ; i++ {
		ok, err := d.element(&first)
		if err != nil {
			return nil, err
		}
		if !ok {
			return out, nil
		}
		if i == MaxTopItems {
			return nil, d.invalid(field, reason("has more than "+strconv.Itoa(MaxTopItems)+" items"))
		}
		var zero T
		out = append(out, zero)
		// Decode into the slice's element: a local passed through elem would escape.
		if err := elem(d, &out[len(out)-1]); err != nil {
			return nil, within(field+"["+strconv.Itoa(i)+"]", err)
		}
	}
}

func (d *decoder) routeCount(r *RouteCount) *ValidationError {
	const (
		bRoute uint32 = 1 << iota
		bCount
	)
	if err := d.object(""); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "route":
			if err = d.seen(&seen, bRoute, "route"); err == nil {
				if r.Route, err = d.str("route"); err == nil {
					if e := validRoute(r.Route); e != nil {
						err = d.invalid("route", e)
					}
				}
			}
		case "count":
			if err = d.seen(&seen, bCount, "count"); err == nil {
				r.Count, err = d.integer("count", 1, MaxSafeInteger)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("", seen, []req{{bRoute, "route"}, {bCount, "count"}})
}

func (d *decoder) topIPs() ([]IPCount, *ValidationError) {
	return topList(d, "evidence.top_ips", (*decoder).ipCount)
}

func (d *decoder) ipCount(c *IPCount) *ValidationError {
	const (
		bIP uint32 = 1 << iota
		bCount
		bShared
	)
	if err := d.object(""); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "ip":
			if err = d.seen(&seen, bIP, "ip"); err == nil {
				c.IP, err = d.ip("ip")
			}
		case "count":
			if err = d.seen(&seen, bCount, "count"); err == nil {
				c.Count, err = d.integer("count", 1, MaxSafeInteger)
			}
		case "shared_principals":
			if err = d.seen(&seen, bShared, "shared_principals"); err == nil {
				c.SharedPrincipals, err = d.integer("shared_principals", 0, MaxSafeInteger)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("", seen, []req{{bIP, "ip"}, {bCount, "count"}, {bShared, "shared_principals"}})
}

func (d *decoder) basis(bs *Basis) *ValidationError {
	const (
		bSource uint32 = 1 << iota
		bKind
		bDenial
		bNew
		bThreshold
	)
	if err := d.object("evidence.basis"); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "source":
			if err = d.seen(&seen, bSource, "source"); err == nil {
				if bs.Source, err = d.str("evidence.basis.source"); err == nil {
					if e := oneOf(bs.Source, basisSources); e != nil {
						err = d.invalid("evidence.basis.source", e)
					}
				}
			}
		case "baseline_kind":
			if err = d.seen(&seen, bKind, "baseline_kind"); err == nil {
				var b []byte
				if b, err = d.strBytes("evidence.basis.baseline_kind"); err == nil {
					k, ok := principalKind(b)
					if !ok {
						return d.invalid("evidence.basis.baseline_kind", oneOf(string(b), principalKinds))
					}
					bs.BaselineKind = k
				}
			}
		case "denial_ratio":
			if err = d.seen(&seen, bDenial, "denial_ratio"); err == nil {
				if bs.DenialRatio, err = d.nonNegative("evidence.basis.denial_ratio"); err == nil && bs.DenialRatio > 1 {
					err = d.invalid("evidence.basis.denial_ratio", reason(fmt.Sprintf("%v is not in [0, 1]", bs.DenialRatio)))
				}
			}
		case "new_networks":
			if err = d.seen(&seen, bNew, "new_networks"); err == nil {
				bs.NewNetworks, err = d.integer("evidence.basis.new_networks", 0, MaxSafeInteger)
			}
		case "network_threshold":
			if err = d.seen(&seen, bThreshold, "network_threshold"); err == nil {
				bs.NetworkThreshold, err = d.integer("evidence.basis.network_threshold", 0, MaxSafeInteger)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("evidence.basis", seen, []req{{bSource, "source"}, {bKind, "baseline_kind"}, {bDenial, "denial_ratio"},
		{bNew, "new_networks"}, {bThreshold, "network_threshold"}})
}

func (d *decoder) eventRef(r *EventRef) *ValidationError {
	const (
		bTopic uint32 = 1 << iota
		bPartition
		bOffset
	)
	if err := d.object("evidence.crossing_event"); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "topic":
			if err = d.seen(&seen, bTopic, "topic"); err == nil {
				if r.Topic, err = d.str("evidence.crossing_event.topic"); err == nil {
					if e := validTopic(r.Topic); e != nil {
						err = d.invalid("evidence.crossing_event.topic", e)
					}
				}
			}
		case "partition":
			if err = d.seen(&seen, bPartition, "partition"); err == nil {
				var p int64
				p, err = d.integer("evidence.crossing_event.partition", 0, math.MaxInt32)
				r.Partition = int32(p)
			}
		case "offset":
			if err = d.seen(&seen, bOffset, "offset"); err == nil {
				r.Offset, err = d.integer("evidence.crossing_event.offset", 0, MaxSafeInteger)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("evidence.crossing_event", seen, []req{{bTopic, "topic"}, {bPartition, "partition"}, {bOffset, "offset"}})
}

func (d *decoder) penalty(p *Penalty) *ValidationError {
	const (
		bMultiplier uint32 = 1 << iota
		bExpiresAt
		bLevel
		bMode
	)
	if err := d.object("penalty"); err != nil {
		return err
	}
	var seen uint32
	first := true
	for {
		name, ok, err := d.member(&first)
		if err != nil {
			return err
		}
		if !ok {
			break
		}
		switch string(name) {
		case "multiplier":
			if err = d.seen(&seen, bMultiplier, "multiplier"); err == nil {
				if p.Multiplier, err = d.float("penalty.multiplier"); err == nil {
					if e := multiplier(p.Multiplier); e != nil {
						err = d.invalid("penalty.multiplier", e)
					}
				}
			}
		case "expires_at":
			if err = d.seen(&seen, bExpiresAt, "expires_at"); err == nil {
				p.ExpiresAt, err = d.time("penalty.expires_at")
			}
		case "level":
			if err = d.seen(&seen, bLevel, "level"); err == nil {
				p.Level, err = d.integer("penalty.level", 1, MaxSafeInteger)
			}
		case "mode":
			if err = d.seen(&seen, bMode, "mode"); err == nil {
				var s string
				s, err = d.enum("penalty.mode", penaltyModes)
				p.Mode = PenaltyMode(s)
			}
		default:
			err = d.skip(1)
		}
		if err != nil {
			return err
		}
	}
	return d.required("penalty", seen, []req{
		{bMultiplier, "multiplier"}, {bExpiresAt, "expires_at"}, {bLevel, "level"}, {bMode, "mode"},
	})
}
