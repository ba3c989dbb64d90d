// Package envoyconf reads envoy ratelimit's configuration (Lyft's domain and
// descriptor-tree YAML) and answers Envoy's ShouldRateLimit calls with the
// same semantics: the most specific match per level, a descriptor that
// matches nothing is OK, fixed windows per unit counted in Redis, replaces,
// unlimited, shadow and quota mode, and the global shadow switch.
//
// The format is envoy ratelimit's documented one; a file written for it loads
// unchanged, and a file that loads here loads in envoy ratelimit: every key
// it refuses is refused. Floodgate's own options for a limit (its algorithm,
// burst and fail policy) are a `# floodgate: {…}` comment on the limit's
// descriptor (extension.go), which envoy ratelimit never reads.
package envoyconf

import (
	"bytes"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/limiter"

	"go.yaml.in/yaml/v3"
)

// Unit is a rate-limit window, as envoy ratelimit names them.
type Unit int

// The units, numbered as envoy.service.ratelimit.v3.RateLimitResponse.RateLimit.Unit.
const (
	UnitUnknown Unit = 0
	UnitSecond  Unit = 1
	UnitMinute  Unit = 2
	UnitHour    Unit = 3
	UnitDay     Unit = 4
	UnitMonth   Unit = 5
	UnitYear    Unit = 6
	UnitWeek    Unit = 7
)

var unitNames = map[string]Unit{
	"second": UnitSecond, "minute": UnitMinute, "hour": UnitHour, "day": UnitDay,
	"week": UnitWeek, "month": UnitMonth, "year": UnitYear,
}

// Seconds is the window length: fixed windows start at multiples of it since
// the Unix epoch (a month is 30 days and a year 365, as in envoy ratelimit).
func (u Unit) Seconds() int64 {
	switch u {
	case UnitSecond:
		return 1
	case UnitMinute:
		return 60
	case UnitHour:
		return 3600
	case UnitDay:
		return 86400
	case UnitWeek:
		return 7 * 86400
	case UnitMonth:
		return 30 * 86400
	case UnitYear:
		return 365 * 86400
	}
	return 0
}

func (u Unit) String() string {
	for n, v := range unitNames {
		if v == u {
			return n
		}
	}
	return "unknown"
}

// Limit is one configured rate limit.
type Limit struct {
	RequestsPerUnit uint32
	Unit            Unit
	Unlimited       bool
	Name            string   // may be replaced by another limit naming it
	Replaces        []string // names of limits this one replaces
	ShadowMode      bool     // over the limit still answers OK (counted, reported)
	QuotaMode       bool     // over the limit fails the call only if every quota descriptor fails
	DetailedMetric  bool
	// Path is the configuration path of the descriptor, "domain.key_value.key",
	// envoy ratelimit's stat key for it; metrics use it.
	Path string
	// Route is the same path as a decision event's route: "/domain/key_value/key",
	// each segment percent-encoded to an RFC 3986 pchar string, at most
	// events.MaxRouteLen bytes (trailing segments dropped to fit). It holds
	// the configuration's values only, never a call's, so its cardinality is
	// the configuration's.
	Route string
	// Source is "file:line" of the rate_limit block.
	Source string
	// Ext is the limit's Floodgate options (a floodgate comment); nil: none,
	// envoy ratelimit's fixed window.
	Ext *Extension
}

// Algorithm is how the limit counts: FixedWindow unless its floodgate
// comment names another.
func (l *Limit) Algorithm() limiter.Algorithm {
	if l.Ext == nil || l.Ext.Algorithm == "" {
		return limiter.FixedWindow
	}
	return l.Ext.Algorithm
}

// Fail is the limit's fail policy ("" unless its floodgate comment sets one).
func (l *Limit) Fail() FailPolicy {
	if l.Ext == nil {
		return ""
	}
	return l.Ext.Fail
}

type node struct {
	children  map[string]*node // by "key_value" or "key"
	wildcards []wildcard       // children whose value holds '*', in file order
	limit     *Limit
	share     bool   // share_threshold: every value matching the wildcard shares one counter
	pattern   string // the wildcard value when share is set
	toMetric  bool   // value_to_metric
	route     string // Limit.Route of a limit on this node
}

type wildcard struct {
	composite string   // "key_val*ue"
	parts     []string // composite split on '*'
}

// Config is a loaded set of domains. It is immutable and safe for concurrent use.
type Config struct {
	domains map[string]*node
	files   []string
}

// Domains lists the configured domains, sorted.
func (c *Config) Domains() []string {
	out := make([]string, 0, len(c.domains))
	for d := range c.domains {
		out = append(out, d)
	}
	sort.Strings(out)
	return out
}

// Has reports whether domain is configured.
func (c *Config) Has(domain string) bool {
	if c == nil {
		return false
	}
	_, ok := c.domains[domain]
	return ok
}

// Files are the files the configuration was read from.
func (c *Config) Files() []string { return c.files }

// Options changes how files are read.
type Options struct {
	// MergeDomains lets several files add to one domain (envoy ratelimit's
	// MERGE_DOMAIN_CONFIG); without it a repeated domain is an error.
	MergeDomains bool
}

// LoadDir reads every *.yaml and *.yml file in dir (not recursively), in name
// order. Errors name the file and line.
func LoadDir(dir string, o Options) (*Config, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("envoy config directory: %w", err)
	}
	var files []File
	for _, e := range entries {
		n := e.Name()
		if e.IsDir() || strings.HasPrefix(n, ".") || !(strings.HasSuffix(n, ".yaml") || strings.HasSuffix(n, ".yml")) {
			continue
		}
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return nil, fmt.Errorf("envoy config: %w", err)
		}
		files = append(files, File{Name: filepath.Join(dir, n), Data: b})
	}
	if len(files) == 0 {
		return nil, fmt.Errorf("envoy config directory %s: no *.yaml files", dir)
	}
	return Load(files, o)
}

// File is one configuration file's name and contents.
type File struct {
	Name string
	Data []byte
}

// Load parses files as envoy ratelimit configurations.
func Load(files []File, o Options) (*Config, error) {
	c := &Config{domains: map[string]*node{}}
	for _, f := range files {
		if err := c.loadFile(f, o); err != nil {
			return nil, err
		}
		c.files = append(c.files, f.Name)
	}
	return c, nil
}

// ErrConfig marks every configuration error.
var ErrConfig = errors.New("invalid envoy ratelimit configuration")

type posError struct {
	file string
	line int
	msg  string
}

func (e *posError) Error() string {
	if e.line > 0 {
		return fmt.Sprintf("%s:%d: %s", e.file, e.line, e.msg)
	}
	return fmt.Sprintf("%s: %s", e.file, e.msg)
}

func (e *posError) Unwrap() error { return ErrConfig }

type loader struct {
	file  string
	opts  Options
	lines []string     // the file's lines, to place comments
	used  map[int]bool // lines of floodgate comments read as a limit's options
}

func (l *loader) errf(n *yaml.Node, format string, args ...any) error {
	line := 0
	if n != nil {
		line = n.Line
	}
	return &posError{file: l.file, line: line, msg: fmt.Sprintf(format, args...)}
}

func (c *Config) loadFile(f File, o Options) error {
	l := &loader{file: f.Name, opts: o, lines: strings.Split(string(f.Data), "\n"), used: map[int]bool{}}
	var doc yaml.Node
	dec := yaml.NewDecoder(bytes.NewReader(f.Data))
	if err := dec.Decode(&doc); err != nil {
		return &posError{file: f.Name, msg: "yaml: " + strings.TrimPrefix(err.Error(), "yaml: ")}
	}
	if len(doc.Content) == 0 {
		return l.errf(&doc, "empty file")
	}
	root := doc.Content[0]
	if root.Kind != yaml.MappingNode {
		return l.errf(root, "the file must be a mapping with domain and descriptors")
	}
	var domain string
	var descs *yaml.Node
	err := l.fields(root, func(k string, kn, v *yaml.Node) error {
		switch k {
		case "domain":
			s, err := l.str(v, k)
			domain = s
			return err
		case "descriptors":
			descs = v
			return nil
		}
		return l.unknown(kn, k, "domain, descriptors")
	})
	if err != nil {
		return err
	}
	if domain == "" {
		return l.errf(root, "config file cannot have empty domain")
	}
	dn, present := c.domains[domain]
	if present && !o.MergeDomains {
		return l.errf(root, "duplicate domain %q in config file", domain)
	}
	if !present {
		dn = &node{children: map[string]*node{}, route: RouteJoin("", domain)}
		c.domains[domain] = dn
	}
	if descs != nil {
		if err := l.descriptors(dn, domain, descs); err != nil {
			return err
		}
	}
	return l.strayDirectives(&doc)
}

// fields walks a mapping, refusing repeated keys.
func (l *loader) fields(m *yaml.Node, f func(k string, kn, v *yaml.Node) error) error {
	seen := map[string]bool{}
	for i := 0; i+1 < len(m.Content); i += 2 {
		kn, v := m.Content[i], m.Content[i+1]
		if kn.Kind != yaml.ScalarNode || kn.Tag != "!!str" {
			return l.errf(kn, "config error, key is not of type string: %s", kn.Value)
		}
		if seen[kn.Value] {
			return l.errf(kn, "key %q appears twice", kn.Value)
		}
		seen[kn.Value] = true
		if err := f(kn.Value, kn, v); err != nil {
			return err
		}
	}
	return nil
}

func (l *loader) unknown(kn *yaml.Node, k, allowed string) error {
	return l.errf(kn, "config error, unknown key %q (allowed here: %s)", k, allowed)
}

func (l *loader) str(v *yaml.Node, field string) (string, error) {
	if v.Kind != yaml.ScalarNode || v.Tag == "!!map" || v.Tag == "!!seq" {
		return "", l.errf(v, "%s must be a string", field)
	}
	if v.Tag == "!!null" {
		return "", nil
	}
	if v.Tag == "!!float" {
		// envoy ratelimit's loader accepts strings, integers and booleans
		// here and refuses a float ("error checking config").
		return "", l.errf(v, "%s must be a string, not the number %s (quote it)", field, v.Value)
	}
	return v.Value, nil
}

func (l *loader) boolean(v *yaml.Node, field string) (bool, error) {
	var b bool
	if v.Kind != yaml.ScalarNode || v.Tag != "!!bool" || v.Decode(&b) != nil {
		return false, l.errf(v, "%s must be true or false, not %q", field, v.Value)
	}
	return b, nil
}

func (l *loader) uint32(v *yaml.Node, field string) (uint32, error) {
	if v.Kind != yaml.ScalarNode || v.Tag != "!!int" {
		return 0, l.errf(v, "%s must be a whole number, not %q", field, v.Value)
	}
	n, err := strconv.ParseUint(v.Value, 0, 64)
	if err != nil || n > math.MaxUint32 {
		return 0, l.errf(v, "%s must be a whole number from 0 to %d, not %q", field, uint32(math.MaxUint32), v.Value)
	}
	return uint32(n), nil
}

const descriptorKeys = "key, value, rate_limit, descriptors, shadow_mode, quota_mode, detailed_metric, value_to_metric, share_threshold"

func (l *loader) descriptors(parent *node, path string, list *yaml.Node) error {
	if list.Tag == "!!null" {
		return nil
	}
	if list.Kind != yaml.SequenceNode {
		return l.errf(list, "descriptors must be a list")
	}
	for _, item := range list.Content {
		if item.Kind != yaml.MappingNode {
			return l.errf(item, "config error, yaml file contains list of type other than map: %s", item.Value)
		}
		if err := l.descriptor(parent, path, item); err != nil {
			return err
		}
	}
	return nil
}

func (l *loader) descriptor(parent *node, path string, m *yaml.Node) error {
	var (
		key, value                             string
		rl, children                           *yaml.Node
		shadow, quota, detailed, toMetric, shr bool
	)
	err := l.fields(m, func(k string, kn, v *yaml.Node) error {
		var err error
		switch k {
		case "key":
			key, err = l.str(v, k)
		case "value":
			value, err = l.str(v, k)
		case "rate_limit":
			rl = v
		case "descriptors":
			children = v
		case "shadow_mode":
			shadow, err = l.boolean(v, k)
		case "quota_mode":
			quota, err = l.boolean(v, k)
		case "detailed_metric":
			detailed, err = l.boolean(v, k)
		case "value_to_metric":
			toMetric, err = l.boolean(v, k)
		case "share_threshold":
			shr, err = l.boolean(v, k)
		case "floodgate":
			err = l.errf(kn, "config error, unknown key %q: envoy ratelimit refuses it; Floodgate's options are a comment, `# floodgate: {%s}`", k, extensionKeys)
		case "metadata":
			// Documented by envoy ratelimit, refused by its loader
			// (validKeys has no metadata in the pinned build): a file
			// holding it does not load there, so it does not load here.
			err = l.errf(kn, "config error, unknown key %q: envoy ratelimit's loader refuses it (allowed here: %s)", k, descriptorKeys)
		default:
			err = l.unknown(kn, k, descriptorKeys)
		}
		return err
	})
	if err != nil {
		return err
	}
	if key == "" {
		return l.errf(m, "descriptor has empty key")
	}
	composite := key
	if value != "" {
		composite += "_" + value
	}
	full := path + "." + composite
	if _, dup := parent.children[composite]; dup {
		return l.errf(m, "duplicate descriptor composite key %q", full)
	}
	n := &node{children: map[string]*node{}, toMetric: toMetric, route: RouteJoin(parent.route, composite)}
	if shr {
		if !strings.Contains(value, "*") {
			return l.errf(m, "share_threshold can only be used with wildcard values (containing '*'), but found key %q", composite)
		}
		n.share, n.pattern = true, value
	}
	if rl != nil {
		lim, err := l.rateLimit(rl, full)
		if err != nil {
			return err
		}
		lim.ShadowMode, lim.QuotaMode, lim.DetailedMetric, lim.Route = shadow, quota, detailed, n.route
		n.limit = lim
	}
	if err := l.extension(m, n.limit); err != nil {
		return err
	}
	if strings.Contains(composite, "*") {
		parent.wildcards = append(parent.wildcards, wildcard{composite: composite, parts: strings.Split(composite, "*")})
	}
	parent.children[composite] = n
	if children != nil {
		return l.descriptors(n, full, children)
	}
	return nil
}

func (l *loader) rateLimit(m *yaml.Node, path string) (*Limit, error) {
	if m.Kind != yaml.MappingNode {
		return nil, l.errf(m, "rate_limit must be a mapping")
	}
	lim := &Limit{Path: path, Source: fmt.Sprintf("%s:%d", l.file, m.Line)}
	var unit string
	var unitNode *yaml.Node
	err := l.fields(m, func(k string, kn, v *yaml.Node) error {
		var err error
		switch k {
		case "unit":
			unit, err = l.str(v, k)
			unitNode = v
		case "requests_per_unit":
			lim.RequestsPerUnit, err = l.uint32(v, k)
		case "unlimited":
			lim.Unlimited, err = l.boolean(v, k)
		case "name":
			lim.Name, err = l.str(v, k)
		case "replaces":
			err = l.replaces(v, lim)
		default:
			err = l.unknown(kn, k, "unit, requests_per_unit, unlimited, name, replaces")
		}
		return err
	})
	if err != nil {
		return nil, err
	}
	u, ok := unitNames[strings.ToLower(unit)]
	switch {
	case lim.Unlimited && ok:
		return nil, l.errf(unitNode, "should not specify rate limit unit when unlimited")
	case !lim.Unlimited && !ok:
		at := unitNode
		if at == nil {
			at = m
		}
		return nil, l.errf(at, "invalid rate limit unit %q (allowed: second, minute, hour, day, week, month, year)", unit)
	}
	lim.Unit = u
	for _, r := range lim.Replaces {
		if r == lim.Name {
			return nil, l.errf(m, "replaces should not contain name of same descriptor")
		}
	}
	return lim, nil
}

func (l *loader) replaces(v *yaml.Node, lim *Limit) error {
	if v.Kind != yaml.SequenceNode {
		return l.errf(v, "replaces must be a list of {name: …}")
	}
	for _, item := range v.Content {
		if item.Kind != yaml.MappingNode {
			return l.errf(item, "replaces must be a list of {name: …}")
		}
		var name string
		err := l.fields(item, func(k string, kn, v *yaml.Node) error {
			if k != "name" {
				return l.unknown(kn, k, "name")
			}
			var err error
			name, err = l.str(v, k)
			return err
		})
		if err != nil {
			return err
		}
		if name == "" {
			return l.errf(item, "should not have an empty replaces entry")
		}
		lim.Replaces = append(lim.Replaces, name)
	}
	return nil
}

// ResetAfter is the time from now to the end of u's current window.
func ResetAfter(u Unit, now time.Time) time.Duration {
	s := u.Seconds()
	return time.Duration(s-now.Unix()%s) * time.Second
}
