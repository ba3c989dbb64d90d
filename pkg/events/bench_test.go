package events

import (
	"encoding/json"
	"fmt"
	"testing"
	"time"
)

// Benchmarks of the hand-written codec against encoding/json doing the same
// job (struct decode or encode, then the same validation). Run with
//
//	go test -run x -bench . -benchmem -cpu 1 ./pkg/events/
//
// events/s is per core (-cpu 1).

func BenchmarkDecodeDecision(b *testing.B) {
	benchDecoders(b, "decision.v1.denied", DecodeDecision, stdDecodeDecision)
}

func BenchmarkEncodeDecision(b *testing.B) {
	ev := decodedExample(b, "decision.v1.denied", DecodeDecision)
	b.Run("floodgate_append", func(b *testing.B) {
		buf := make([]byte, 0, 1024)
		benchEncode(b, func() ([]byte, error) { return AppendDecision(buf[:0], &ev) })
	})
	b.Run("floodgate", func(b *testing.B) {
		benchEncode(b, func() ([]byte, error) { return EncodeDecision(&ev) })
	})
	b.Run("encoding_json", func(b *testing.B) {
		benchEncode(b, func() ([]byte, error) { return stdEncodeDecision(&ev) })
	})
}

func BenchmarkDecodeAbuse(b *testing.B) {
	benchDecoders(b, "abuse.v1.distributed_ip", DecodeAbuse, stdDecodeAbuse)
}

func BenchmarkEncodeAbuse(b *testing.B) {
	ev := decodedExample(b, "abuse.v1.distributed_ip", DecodeAbuse)
	b.Run("floodgate", func(b *testing.B) {
		benchEncode(b, func() ([]byte, error) { return EncodeAbuse(&ev) })
	})
}

func BenchmarkDecodeAdjustment(b *testing.B) {
	benchDecoders(b, "adjustment.v1", DecodeAdjustment, nil)
}

// decodedExample returns the example decoded with decode.
func decodedExample[T any](b *testing.B, name string, decode func([]byte) (T, error)) T {
	ev, err := decode(compactExample(b, name))
	if err != nil {
		b.Fatal(err)
	}
	return ev
}

// benchDecoders benchmarks decoding the example, compacted, with this codec
// ("floodgate") and, unless std is nil, with encoding/json ("encoding_json").
func benchDecoders[T any](b *testing.B, example string, floodgate, std func([]byte) (T, error)) {
	data := compactExample(b, example)
	for _, run := range []struct {
		name   string
		decode func([]byte) (T, error)
	}{{"floodgate", floodgate}, {"encoding_json", std}} {
		if run.decode == nil {
			continue
		}
		b.Run(run.name, func(b *testing.B) {
			benchDecode(b, data, func(d []byte) error { _, err := run.decode(d); return err })
		})
	}
}

func benchDecode(b *testing.B, data []byte, decode func([]byte) error) {
	b.SetBytes(int64(len(data)))
	b.ReportAllocs()
	for b.Loop() {
		if err := decode(data); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

func benchEncode(b *testing.B, encode func() ([]byte, error)) {
	out, err := encode()
	if err != nil {
		b.Fatal(err)
	}
	b.SetBytes(int64(len(out)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := encode(); err != nil {
			b.Fatal(err)
		}
	}
	b.ReportMetric(float64(b.N)/b.Elapsed().Seconds(), "events/s")
}

// compactExample returns an example as this codec encodes it (no white space),
// which is what travels on Kafka.
func compactExample(b *testing.B, name string) []byte {
	data := loadExample(b, name)
	for _, typ := range eventTypes {
		c := codecFor(b, typ)
		if v, err := c.decode(data); err == nil {
			out, err := c.encode(v)
			if err != nil {
				b.Fatal(err)
			}
			return out
		}
	}
	b.Fatalf("%s decodes as no event type", name)
	return nil
}

// The encoding/json baseline: mirror structs with tags, then the same
// conversions and validation. (It checks less than the real decoder: it cannot
// see a missing boolean or a null, nor duplicate or case-folded member names.)

type stdPrincipal struct {
	Kind string `json:"kind"`
	ID   string `json:"id"`
}

type stdDecision struct {
	Type              string       `json:"type"`
	ID                string       `json:"id"`
	TS                string       `json:"ts"`
	Principal         stdPrincipal `json:"principal"`
	IP                string       `json:"ip"`
	Method            string       `json:"method"`
	Route             string       `json:"route"`
	Resource          string       `json:"resource,omitempty"`
	Allowed           bool         `json:"allowed"`
	Tier              string       `json:"tier"`
	Shadow            bool         `json:"shadow"`
	Cost              int64        `json:"cost"`
	Limit             int64        `json:"limit"`
	Remaining         int64        `json:"remaining"`
	Gateway           string       `json:"gateway"`
	NearLimit         bool         `json:"near_limit,omitempty"`
	Degraded          bool         `json:"degraded,omitempty"`
	Rule              string       `json:"rule,omitempty"`
	PenaltyMultiplier float64      `json:"penalty_multiplier,omitempty"`
}

// stdUnmarshal unmarshals data into s, whose type member is *typ, and checks
// that the type is want.
func stdUnmarshal(data []byte, s any, typ *string, want string) error {
	if err := json.Unmarshal(data, s); err != nil {
		return err
	}
	if *typ != want {
		return fmt.Errorf("type %q", *typ)
	}
	return nil
}

func stdDecodeDecision(data []byte) (Decision, error) {
	var s stdDecision
	if err := stdUnmarshal(data, &s, &s.Type, TypeDecision); err != nil {
		return Decision{}, err
	}
	ts, err := ParseTime(s.TS)
	if err != nil {
		return Decision{}, err
	}
	ip, err := ParseIP(s.IP)
	if err != nil {
		return Decision{}, err
	}
	d := Decision{
		ID: s.ID, TS: ts, Principal: Principal{PrincipalKind(s.Principal.Kind), s.Principal.ID}, IP: ip,
		Method: s.Method, Route: s.Route, Resource: s.Resource, Allowed: s.Allowed, Tier: Tier(s.Tier),
		Shadow: s.Shadow, Cost: s.Cost, Limit: s.Limit, Remaining: s.Remaining, Gateway: s.Gateway,
		NearLimit: s.NearLimit, Degraded: s.Degraded, Rule: s.Rule, PenaltyMultiplier: s.PenaltyMultiplier,
	}
	return d, d.Validate()
}

func stdEncodeDecision(d *Decision) ([]byte, error) {
	if err := d.Validate(); err != nil {
		return nil, err
	}
	return json.Marshal(stdDecision{
		Type: TypeDecision, ID: d.ID, TS: FormatTime(d.TS), Principal: stdPrincipal{string(d.Principal.Kind), d.Principal.ID},
		IP: d.IP.String(), Method: d.Method, Route: d.Route, Resource: d.Resource, Allowed: d.Allowed,
		Tier: string(d.Tier), Shadow: d.Shadow, Cost: d.Cost, Limit: d.Limit, Remaining: d.Remaining,
		Gateway: d.Gateway, NearLimit: d.NearLimit, Degraded: d.Degraded, Rule: d.Rule,
		PenaltyMultiplier: d.PenaltyMultiplier,
	})
}

type stdAbuse struct {
	Type       string       `json:"type"`
	ID         string       `json:"id"`
	DetectedAt string       `json:"detected_at"`
	Principal  stdPrincipal `json:"principal"`
	Pattern    string       `json:"pattern"`
	Severity   string       `json:"severity"`
	Score      float64      `json:"score"`
	Window     struct {
		Start   string `json:"start"`
		End     string `json:"end"`
		Seconds int64  `json:"seconds"`
	} `json:"window"`
	FirstEventAt string `json:"first_event_at"`
	Evidence     struct {
		ObservedRate float64 `json:"observed_rate"`
		BaselineRate float64 `json:"baseline_rate"`
		Threshold    float64 `json:"threshold"`
		EventCount   int64   `json:"event_count"`
		DistinctIPs  int64   `json:"distinct_ips"`
		DistinctIP24 int64   `json:"distinct_ip24"`
		DistinctIP64 int64   `json:"distinct_ip64"`
		TopRoutes    []struct {
			Route string `json:"route"`
			Count int64  `json:"count"`
		} `json:"top_routes"`
		TopIPs []struct {
			IP               string `json:"ip"`
			Count            int64  `json:"count"`
			SharedPrincipals int64  `json:"shared_principals"`
		} `json:"top_ips"`
	} `json:"evidence"`
	Penalty struct {
		Multiplier float64 `json:"multiplier"`
		ExpiresAt  string  `json:"expires_at"`
		Level      int64   `json:"level"`
		Mode       string  `json:"mode"`
	} `json:"penalty"`
	DetectorVersion string `json:"detector_version"`
}

func stdDecodeAbuse(data []byte) (Abuse, error) {
	var s stdAbuse
	if err := stdUnmarshal(data, &s, &s.Type, TypeAbuse); err != nil {
		return Abuse{}, err
	}
	var err error
	times := func(s string) time.Time {
		t, e := ParseTime(s)
		if e != nil && err == nil {
			err = e
		}
		return t
	}
	a := Abuse{
		ID: s.ID, DetectedAt: times(s.DetectedAt), Principal: Principal{PrincipalKind(s.Principal.Kind), s.Principal.ID},
		Pattern: Pattern(s.Pattern), Severity: Severity(s.Severity), Score: s.Score,
		Window:       Window{times(s.Window.Start), times(s.Window.End), s.Window.Seconds},
		FirstEventAt: times(s.FirstEventAt),
		Evidence: Evidence{
			ObservedRate: s.Evidence.ObservedRate, BaselineRate: s.Evidence.BaselineRate, Threshold: s.Evidence.Threshold,
			EventCount: s.Evidence.EventCount, DistinctIPs: s.Evidence.DistinctIPs,
			DistinctIP24: s.Evidence.DistinctIP24, DistinctIP64: s.Evidence.DistinctIP64,
		},
		Penalty:         Penalty{Multiplier: s.Penalty.Multiplier, ExpiresAt: times(s.Penalty.ExpiresAt), Level: s.Penalty.Level, Mode: PenaltyMode(s.Penalty.Mode)},
		DetectorVersion: s.DetectorVersion,
	}
	for _, r := range s.Evidence.TopRoutes {
		a.Evidence.TopRoutes = append(a.Evidence.TopRoutes, RouteCount{r.Route, r.Count})
	}
	for _, c := range s.Evidence.TopIPs {
		ip, e := ParseIP(c.IP)
		if e != nil && err == nil {
			err = e
		}
		a.Evidence.TopIPs = append(a.Evidence.TopIPs, IPCount{ip, c.Count, c.SharedPrincipals})
	}
	if err != nil {
		return Abuse{}, err
	}
	return a, a.Validate()
}
