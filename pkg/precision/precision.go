// Package precision measures how often the detector is right, from
// trust-and-safety verdicts on its detections (verdict.v1, docs/console.md):
// the precision of a pattern, a principal kind, a route template and a
// network class over time, the thresholds a pattern's precision must keep,
// and (proposal.go) detector parameters that would have avoided a class of
// false positives, proven by replaying the judged detections.
//
// Precision is confirmed / (confirmed + false_positive); unsure verdicts are
// counted but judge nothing. It knows nothing of DynamoDB, HTTP or Kafka: the
// console reads the verdicts and hands them here.
package precision

import (
	"fmt"
	"net/netip"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/events"
)

// Network classes of a detection: the kind of address its evidence came from.
const (
	NetworkDatacenter = "datacenter"     // the top address is in a configured datacenter range
	NetworkShared     = "shared_address" // the top address is shared by SharedMin or more other principals (NAT, proxy)
	NetworkIPv6       = "ipv6_64"        // the top address is IPv6 (counted by /64)
	NetworkIPv4       = "ipv4"           // an IPv4 address of the principal's own
	NetworkUnknown    = "unknown"        // no address in the evidence
)

// Networks lists the network classes in display order.
var Networks = []string{NetworkDatacenter, NetworkShared, NetworkIPv6, NetworkIPv4, NetworkUnknown}

// SharedMin is how many other principals on one address make it shared:
// the console's alert page marks such an address NAT.
const SharedMin = 5

// Classifier names a detection's network class.
type Classifier struct {
	// Datacenter are the address ranges of hosting providers, when known
	// (FLOODGATE_CONSOLE_DATACENTER_RANGES); none: no detection is
	// classed datacenter.
	Datacenter []netip.Prefix
}

// ParsePrefixes reads a list of CIDR prefixes.
func ParsePrefixes(list []string) ([]netip.Prefix, error) {
	out := make([]netip.Prefix, 0, len(list))
	for _, s := range list {
		p, err := netip.ParsePrefix(strings.TrimSpace(s))
		if err != nil {
			return nil, fmt.Errorf("datacenter range %q: %w", s, err)
		}
		out = append(out, p.Masked())
	}
	return out, nil
}

// Network is the class of a detection's top address (its first top_ips
// entry, the one with the most events).
func (c Classifier) Network(ev *events.Abuse) string {
	if ev == nil || len(ev.Evidence.TopIPs) == 0 {
		return NetworkUnknown
	}
	top := ev.Evidence.TopIPs[0]
	ip := top.IP.Unmap()
	for _, p := range c.Datacenter {
		if p.Contains(ip) {
			return NetworkDatacenter
		}
	}
	switch {
	case top.SharedPrincipals >= SharedMin:
		return NetworkShared
	case ip.Is6():
		return NetworkIPv6
	default:
		return NetworkIPv4
	}
}

// Route is a detection's top route template ("" when the evidence has none).
func Route(ev *events.Abuse) string {
	if ev == nil || len(ev.Evidence.TopRoutes) == 0 {
		return ""
	}
	return ev.Evidence.TopRoutes[0].Route
}

// Judged is one detection with its latest verdict.
type Judged struct {
	AbuseID    string
	Pattern    string
	Kind       string // principal kind
	Route      string // top route template
	Network    string // network class
	DetectedAt time.Time
	Verdict    events.VerdictValue
}

// Dim is one dimension precision is broken down by.
type Dim string

// The dimensions.
const (
	DimPattern Dim = "pattern"
	DimKind    Dim = "kind"
	DimRoute   Dim = "route"
	DimNetwork Dim = "network"
)

// Dims lists the dimensions in display order.
var Dims = []Dim{DimPattern, DimKind, DimRoute, DimNetwork}

// ParseDim reads a dimension's name.
func ParseDim(s string) (Dim, error) {
	for _, d := range Dims {
		if string(d) == s {
			return d, nil
		}
	}
	return "", fmt.Errorf("dimension %q is not one of pattern|kind|route|network", s)
}

func (j Judged) value(d Dim) string {
	switch d {
	case DimPattern:
		return j.Pattern
	case DimKind:
		return j.Kind
	case DimRoute:
		return j.Route
	default:
		return j.Network
	}
}

// Count is the verdicts of one group.
type Count struct {
	Confirmed, FalsePositive, Unsure int64
}

// Judged is how many verdicts judged the detections (unsure excluded).
func (c Count) Judged() int64 { return c.Confirmed + c.FalsePositive }

// Precision is confirmed / judged; ok is false when nothing was judged.
func (c Count) Precision() (p float64, ok bool) {
	if c.Judged() == 0 {
		return 0, false
	}
	return float64(c.Confirmed) / float64(c.Judged()), true
}

// Percent is the precision as text ("—" when nothing was judged).
func (c Count) Percent() string {
	p, ok := c.Precision()
	if !ok {
		return "—"
	}
	return strconv.FormatFloat(100*p, 'f', 2, 64) + " %"
}

func (c *Count) add(v events.VerdictValue) {
	switch v {
	case events.VerdictConfirmed:
		c.Confirmed++
	case events.VerdictFalsePositive:
		c.FalsePositive++
	default:
		c.Unsure++
	}
}

// Row is one group's counts over the whole range and per bucket.
type Row struct {
	Value   string // the group's value in the dimension ("" shown as unknown)
	Total   Count
	Buckets []Count // one per Table.Starts entry
}

// Table is precision by one dimension over time.
type Table struct {
	Dim    Dim
	Starts []time.Time // bucket starts, oldest first
	Bucket time.Duration
	Rows   []Row // most judged first
	All    Row   // every detection
}

// Compute breaks js down by d in buckets of the given width from since to
// until (detections outside are left out), by detection time.
func Compute(js []Judged, d Dim, since, until time.Time, bucket time.Duration) Table {
	if bucket <= 0 {
		bucket = 24 * time.Hour
	}
	since = since.UTC().Truncate(bucket)
	n := int(until.Sub(since)/bucket) + 1
	if n < 1 {
		n = 1
	}
	t := Table{Dim: d, Bucket: bucket, Starts: make([]time.Time, n), All: Row{Value: "all", Buckets: make([]Count, n)}}
	for i := range t.Starts {
		t.Starts[i] = since.Add(time.Duration(i) * bucket)
	}
	rows := map[string]*Row{}
	for _, j := range js {
		if j.DetectedAt.Before(since) || j.DetectedAt.After(until) {
			continue
		}
		i := int(j.DetectedAt.Sub(since) / bucket)
		if i >= n {
			i = n - 1
		}
		v := j.value(d)
		r := rows[v]
		if r == nil {
			r = &Row{Value: v, Buckets: make([]Count, n)}
			rows[v] = r
		}
		r.Total.add(j.Verdict)
		r.Buckets[i].add(j.Verdict)
		t.All.Total.add(j.Verdict)
		t.All.Buckets[i].add(j.Verdict)
	}
	for _, r := range rows {
		t.Rows = append(t.Rows, *r)
	}
	sort.Slice(t.Rows, func(a, b int) bool {
		if x, y := t.Rows[a].Total.Judged(), t.Rows[b].Total.Judged(); x != y {
			return x > y
		}
		return t.Rows[a].Value < t.Rows[b].Value
	})
	return t
}

// Group is one combination of all four dimensions.
type Group struct{ Pattern, Kind, Route, Network string }

// ByGroup counts the verdicts of every combination of the dimensions among
// detections made from since on (what the console exports as metrics).
func ByGroup(js []Judged, since time.Time) map[Group]Count {
	out := map[Group]Count{}
	for _, j := range js {
		if j.DetectedAt.Before(since) {
			continue
		}
		g := Group{j.Pattern, j.Kind, j.Route, j.Network}
		c := out[g]
		c.add(j.Verdict)
		out[g] = c
	}
	return out
}

// Thresholds are the precision each pattern must keep over the window.
type Thresholds struct {
	Default    float64            // for a pattern not listed
	ByPattern  map[string]float64 // pattern → threshold
	MinJudged  int64              // fewer judged verdicts decide nothing
	WindowDays int
}

// ParseThresholds reads "0.95" or "0.95,rapid_fire=0.99,distributed_ip=0.9"
// (a bare number is the default).
func ParseThresholds(s string) (Thresholds, error) {
	t := Thresholds{Default: 0.95, ByPattern: map[string]float64{}}
	for _, part := range strings.Split(s, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, val, named := strings.Cut(part, "=")
		if !named {
			val = name
		}
		f, err := strconv.ParseFloat(strings.TrimSpace(val), 64)
		if err != nil || f < 0 || f > 1 {
			return t, fmt.Errorf("precision threshold %q: want a number in 0..1", part)
		}
		if !named {
			t.Default = f
			continue
		}
		name = strings.TrimSpace(name)
		if !events.Pattern(name).Valid() {
			return t, fmt.Errorf("precision threshold %q: %q is not a pattern", part, name)
		}
		t.ByPattern[name] = f
	}
	return t, nil
}

// For is pattern's threshold.
func (t Thresholds) For(pattern string) float64 {
	if v, ok := t.ByPattern[pattern]; ok {
		return v
	}
	return t.Default
}

// Breach is a pattern whose precision over the window is below its threshold.
type Breach struct {
	Pattern   string
	Count     Count
	Threshold float64
}

// Breaches are the patterns of table (by pattern) below their thresholds
// with at least MinJudged judged verdicts, by their Total.
func (t Thresholds) Breaches(table Table) []Breach {
	var out []Breach
	for _, r := range table.Rows {
		p, ok := r.Total.Precision()
		if !ok || r.Total.Judged() < t.MinJudged {
			continue
		}
		if th := t.For(r.Value); p < th {
			out = append(out, Breach{Pattern: r.Value, Count: r.Total, Threshold: th})
		}
	}
	return out
}
