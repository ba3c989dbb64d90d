package eventgen

import (
	"encoding/json"
	"fmt"
	"math"
	"slices"
	"strings"
)

// kind is how a member is represented in Go and on the wire.
type kind int

const (
	kConst  kind = iota // the "type" member: a string constant
	kString             // a string checked by a hand-written grammar (x-floodgate-format)
	kEnum               // a string enum (x-floodgate-enum)
	kTime               // a timestamp: time.Time
	kIP                 // an IP address: netip.Addr
	kBool
	kInt
	kFloat
	kStruct // an object (x-floodgate-go-type); a pointer when optional
	kList   // an array of objects
)

// grammar maps an x-floodgate-format value to the hand-written Go function in
// pkg/events that checks it, and to the constant of type format that names it
// to the decoder's string reader (members.go). In validate, %s is the value
// and %m the x-floodgate-max-const.
type grammar struct {
	format   string // "fmtRoute"
	validate string // "validRoute(%s)"
	// max: the check takes a length limit, the x-floodgate-max-const.
	max bool
	// raw: every valid value is printable ASCII without '"' and '\\', so the
	// encoder copies it between quotes without escaping.
	raw bool
}

var formats = map[string]grammar{
	"id":             {format: "fmtID", validate: "validID(%s)", raw: true},
	"route":          {format: "fmtRoute", validate: "validRoute(%s)", raw: true},
	"topic":          {format: "fmtTopic", validate: "validTopic(%s)", raw: true},
	"resource":       {format: "fmtResource", validate: "validResource(%s)"},
	"principal-id":   {format: "fmtPrincipalID", validate: "validPrincipalID(%s)"},
	"text":           {format: "fmtText", validate: "validText(%s, %m, false)", max: true},
	"multiline-text": {format: "fmtMultilineText", validate: "validText(%s, %m, true)", max: true},
	"base64":         {format: "fmtBase64", validate: "validBase64(%s, %m)", max: true, raw: true},
	// timestamp and ip have Go types of their own (kTime, kIP).
	"timestamp": {},
	"ip":        {},
}

func formatNames() string {
	var names []string
	for k := range formats {
		names = append(names, k)
	}
	slices.Sort(names)
	return strings.Join(names, ", ")
}

type enumType struct {
	spec   enumSpec
	values []string
	goType string // the Go type of values: spec.Name, or "string"
	list   string // name of an exported "|"-separated list constant ("" for none; enum.values lists every enum)
	id     string // name of its constant of type enum (pkg/events), for enumValue
	doc    string
	where  string // first schema path it was seen at
	files  map[string]bool
}

type structType struct {
	name   string
	doc    string
	dpath  string // the decoder's error path of the object: "" at the root and in arrays
	fields []*field
	event  *event // set for the root of a schema
	files  map[string]bool
	where  string
}

type event struct {
	title     string // "decision.v1"
	typeConst string // "TypeDecision"
	ceConst   string // "CETypeDecision"
	root      *structType
	file      string
	buffer    int // initial capacity of EncodeX's buffer
}

type field struct {
	json     string
	goName   string
	doc      string
	required bool
	kind     kind
	dpath    string // the decoder's error path of the member
	format   grammar
	maxConst string
	enum     *enumType
	strct    *structType
	constV   string
	goInt    string // int64 or int32
	ilo, ihi int64
	flo, fhi float64
	fexcl    bool // flo is exclusive
	fhasHi   bool
	maxItems int64
}

type constant struct {
	name  string
	value int64
	doc   string
	files map[string]bool
}

// model is everything the generator emits, in first-seen order.
type model struct {
	events  []*event
	structs []*structType
	enums   []*enumType
	consts  []*constant
	byName  map[string]any
	curFile string
}

func buildModel(schemas []*schemaFile) (*model, error) {
	m := &model{byName: map[string]any{}}
	for _, sf := range schemas {
		m.curFile = sf.file
		if err := m.event(sf); err != nil {
			return nil, fmt.Errorf("%s: %w", sf.file, err)
		}
	}
	// What a type uses is used by every schema that uses the type.
	for changed := true; changed; {
		changed = false
		union := func(dst, src map[string]bool) {
			for f := range src {
				if !dst[f] {
					dst[f], changed = true, true
				}
			}
		}
		for _, st := range m.structs {
			for _, f := range st.fields {
				if f.enum != nil {
					union(f.enum.files, st.files)
				}
				if f.strct != nil {
					union(f.strct.files, st.files)
				}
				if c, ok := m.byName[f.maxConst].(*constant); ok {
					union(c.files, st.files)
				}
			}
		}
	}
	return m, nil
}

func (m *model) event(sf *schemaFile) error {
	root := sf.root
	if root.typ != "object" || root.goType == "" {
		return fmt.Errorf("the root must be an object with x-floodgate-go-type")
	}
	if len(root.props) == 0 || root.props[0].name != "type" || !root.props[0].n.hasCon || root.props[0].n.constV != sf.title {
		return fmt.Errorf(`the first property must be "type" with "const": %q`, sf.title)
	}
	ev := &event{
		title:     sf.title,
		typeConst: "Type" + root.goType,
		ceConst:   "CEType" + root.goType,
		file:      sf.file,
		buffer:    512,
	}
	if err := m.claim(ev.typeConst, ev); err != nil {
		return err
	}
	st, err := m.structOf(root, "")
	if err != nil {
		return err
	}
	ev.root, st.event = st, ev
	for _, f := range allFields(st) {
		if f.kind == kList {
			ev.buffer = 1024
		}
	}
	m.events = append(m.events, ev)
	return nil
}

func allFields(s *structType) []*field {
	var out []*field
	for _, f := range s.fields {
		out = append(out, f)
		if f.strct != nil {
			out = append(out, allFields(f.strct)...)
		}
	}
	return out
}

// claim reserves a Go identifier for one thing.
func (m *model) claim(name string, v any) error {
	if prev, ok := m.byName[name]; ok && prev != v {
		return fmt.Errorf("Go name %s is used twice", name)
	}
	m.byName[name] = v
	return nil
}

func join(path, name string) string {
	if path == "" {
		return name
	}
	return path + "." + name
}

func (m *model) structOf(n *node, dpath string) (*structType, error) {
	if n.goType == "" {
		return nil, fmt.Errorf("%s: an object needs x-floodgate-go-type (the Go struct name)", n.path)
	}
	if prev, ok := m.byName[n.goType].(*structType); ok {
		// The same object in another place or another schema (a shared
		// $defs entry): it must be the same, decoded at the same path.
		again, err := m.newStruct(n, dpath, true)
		if err != nil {
			return nil, err
		}
		if sig(again) != sig(prev) || prev.dpath != dpath {
			return nil, fmt.Errorf("%s: x-floodgate-go-type %s differs from the one at %s (a Go type must describe one object at one path)", n.path, n.goType, prev.where)
		}
		prev.files[m.curFile] = true
		return prev, nil
	}
	st, err := m.newStruct(n, dpath, false)
	if err != nil {
		return nil, err
	}
	if err := m.claim(st.name, st); err != nil {
		return nil, err
	}
	m.structs = append(m.structs, st)
	return st, nil
}

func sig(s *structType) string {
	var b strings.Builder
	for _, f := range s.fields {
		fmt.Fprintf(&b, "%s/%s/%v/%d/%s/%s/%d/%d/%g/%g/%v/%v/%d/%s;", f.json, f.goName, f.required, f.kind, f.format.format, f.maxConst,
			f.ilo, f.ihi, f.flo, f.fhi, f.fexcl, f.fhasHi, f.maxItems, f.goInt)
		if f.enum != nil {
			b.WriteString(f.enum.spec.Name)
		}
		if f.strct != nil {
			b.WriteString(f.strct.name)
		}
	}
	return b.String()
}

func (m *model) newStruct(n *node, dpath string, dryRun bool) (*structType, error) {
	if n.typ != "object" {
		return nil, fmt.Errorf("%s: x-floodgate-go-type %s on a %q, want an object", n.path, n.goType, n.typ)
	}
	doc := n.desc
	if n.defDesc != "" {
		doc = n.defDesc
	}
	st := &structType{name: n.goType, doc: doc, dpath: dpath, files: map[string]bool{m.curFile: true}, where: m.curFile + " " + n.path}
	for _, r := range n.req {
		if !slices.ContainsFunc(n.props, func(p prop) bool { return p.name == r }) {
			return nil, fmt.Errorf("%s: required member %q has no property", n.path, r)
		}
	}
	if len(n.props) > 32 {
		return nil, fmt.Errorf("%s: more than 32 properties: widen the decoder's seen mask", n.path)
	}
	names := map[string]bool{}
	for i, p := range n.props {
		f, err := m.fieldOf(p, slices.Contains(n.req, p.name), dpath, dryRun)
		if err != nil {
			return nil, err
		}
		if i == 0 && !f.required {
			return nil, fmt.Errorf("%s: the first property of an object must be required (the encoder writes the separators statically)", p.n.path)
		}
		if names[f.goName] {
			return nil, fmt.Errorf("%s: two members map to the Go name %s", p.n.path, f.goName)
		}
		names[f.goName] = true
		st.fields = append(st.fields, f)
	}
	return st, nil
}

func (m *model) fieldOf(p prop, required bool, dpath string, dryRun bool) (*field, error) {
	n := p.n
	f := &field{json: p.name, goName: goName(p.name), doc: n.desc, required: required, dpath: join(dpath, p.name), maxConst: n.maxConst}
	if !isPlainASCII(p.name) {
		return nil, fmt.Errorf("%s: member names must be plain ASCII", n.path)
	}
	switch {
	case n.hasCon:
		if n.path != "type" {
			return nil, fmt.Errorf("%s: const is supported only for the root \"type\" member", n.path)
		}
		f.kind, f.constV = kConst, n.constV
		return f, nil
	case n.enumSpec != nil:
		e, err := m.enumOf(n, dryRun)
		if err != nil {
			return nil, err
		}
		f.kind, f.enum = kEnum, e
	case n.typ == "string":
		if n.enum != nil {
			return nil, fmt.Errorf("%s: an enum needs x-floodgate-enum (its Go name)", n.path)
		}
		fm, ok := formats[n.format]
		if !ok {
			return nil, fmt.Errorf("%s: a string needs x-floodgate-format, one of %s (got %q); a new grammar is a hand-written function in pkg/events, a format constant in members.go and an entry in eventgen's formats", n.path, formatNames(), n.format)
		}
		switch n.format {
		case "timestamp":
			f.kind = kTime
		case "ip":
			f.kind = kIP
		default:
			f.kind, f.format = kString, fm
			if fm.max && n.maxConst == "" {
				return nil, fmt.Errorf("%s: format %s needs x-floodgate-max-const", n.path, n.format)
			}
		}
		if n.maxConst != "" {
			if n.maxLen == nil {
				return nil, fmt.Errorf("%s: x-floodgate-max-const without maxLength", n.path)
			}
			if err := m.constOf(n.maxConst, *n.maxLen, fmt.Sprintf("the maxLength of %s", n.path), dryRun); err != nil {
				return nil, fmt.Errorf("%s: %w", n.path, err)
			}
		}
		if !required && (n.minLen == nil || *n.minLen < 1) {
			return nil, fmt.Errorf("%s: an optional string needs minLength >= 1, so that \"\" can mean absent", n.path)
		}
	case n.typ == "boolean":
		f.kind = kBool
	case n.typ == "integer":
		if n.min == nil || n.max == nil {
			return nil, fmt.Errorf("%s: an integer needs minimum and maximum", n.path)
		}
		lo, err1 := n.min.Int64()
		hi, err2 := n.max.Int64()
		if err1 != nil || err2 != nil || hi > 1<<53-1 || lo < -(1<<53-1) {
			return nil, fmt.Errorf("%s: integer bounds must be integers within ±(2^53-1)", n.path)
		}
		f.kind, f.ilo, f.ihi, f.goInt = kInt, lo, hi, "int64"
		switch n.goType {
		case "", "int64":
		case "int32":
			if lo < math.MinInt32 || hi > math.MaxInt32 {
				return nil, fmt.Errorf("%s: bounds do not fit int32", n.path)
			}
			f.goInt = "int32"
		default:
			return nil, fmt.Errorf("%s: x-floodgate-go-type of an integer is int64 or int32, got %q", n.path, n.goType)
		}
		if !required && lo < 1 {
			return nil, fmt.Errorf("%s: an optional integer needs minimum >= 1, so that 0 can mean absent", n.path)
		}
	case n.typ == "number":
		f.kind = kFloat
		bound := func(v *json.Number) (float64, error) {
			x, err := v.Float64()
			if err != nil || (x != 0 && x != 1 && x != 10) {
				// decoder.float compares boundary literals exactly only for 0, 1 and 10.
				return 0, fmt.Errorf("%s: number bounds must be 0, 1 or 10 (see decoder.float in read.go), got %s", n.path, *v)
			}
			return x, nil
		}
		var err error
		switch {
		case n.min != nil && n.exclMin != nil:
			return nil, fmt.Errorf("%s: minimum and exclusiveMinimum together", n.path)
		case n.min != nil:
			f.flo, err = bound(n.min)
		case n.exclMin != nil:
			f.flo, err = bound(n.exclMin)
			f.fexcl = true
		default:
			return nil, fmt.Errorf("%s: a number needs minimum or exclusiveMinimum", n.path)
		}
		if err != nil {
			return nil, err
		}
		if n.max != nil {
			if f.fhi, err = bound(n.max); err != nil {
				return nil, err
			}
			f.fhasHi = true
		}
		if !required && !(f.fexcl && f.flo == 0) {
			return nil, fmt.Errorf("%s: an optional number needs exclusiveMinimum 0, so that 0 can mean absent", n.path)
		}
	case n.typ == "object":
		st, err := m.structOf(n, join(dpath, p.name))
		if err != nil {
			return nil, err
		}
		f.kind, f.strct = kStruct, st
	case n.typ == "array":
		if n.items == nil || n.items.typ != "object" {
			return nil, fmt.Errorf("%s: only arrays of objects are supported", n.path)
		}
		if n.maxItem == nil || n.maxConst == "" {
			return nil, fmt.Errorf("%s: an array needs maxItems and x-floodgate-max-const", n.path)
		}
		if !required {
			return nil, fmt.Errorf("%s: optional arrays are not supported (nil and empty would be one value)", n.path)
		}
		if err := m.constOf(n.maxConst, *n.maxItem, fmt.Sprintf("the maxItems of %s", n.path), dryRun); err != nil {
			return nil, fmt.Errorf("%s: %w", n.path, err)
		}
		st, err := m.structOf(n.items, "")
		if err != nil {
			return nil, err
		}
		f.kind, f.strct, f.maxItems = kList, st, *n.maxItem
	default:
		return nil, fmt.Errorf("%s: unsupported schema type %q", n.path, n.typ)
	}
	return f, nil
}

func (m *model) constOf(name string, v int64, doc string, dryRun bool) error {
	if prev, ok := m.byName[name].(*constant); ok {
		if prev.value != v {
			return fmt.Errorf("%s is %d here and %d elsewhere", name, v, prev.value)
		}
		if !dryRun {
			prev.files[m.curFile] = true
		}
		return nil
	}
	if dryRun {
		return nil
	}
	c := &constant{name: name, value: v, doc: doc, files: map[string]bool{m.curFile: true}}
	if err := m.claim(name, c); err != nil {
		return err
	}
	m.consts = append(m.consts, c)
	return nil
}

func (m *model) enumOf(n *node, dryRun bool) (*enumType, error) {
	spec := *n.enumSpec
	if n.typ != "string" || len(n.enum) == 0 {
		return nil, fmt.Errorf("%s: x-floodgate-enum needs a string enum", n.path)
	}
	if spec.Name == "" {
		return nil, fmt.Errorf("%s: x-floodgate-enum needs a name", n.path)
	}
	for _, v := range n.enum {
		if !isPlainASCII(v) || v == "" {
			return nil, fmt.Errorf("%s: enum value %q must be plain ASCII", n.path, v)
		}
	}
	prev, ok := m.byName[spec.Name].(*enumType)
	if !ok { // an enum of plain strings declares no type of its name: find it by its spec
		for _, e := range m.enums {
			if e.spec.Name == spec.Name {
				prev, ok = e, true
				break
			}
		}
	}
	if ok {
		if prev.spec.Type != spec.Type || prev.spec.Prefix != spec.Prefix || prev.spec.List != spec.List ||
			!slices.Equal(prev.values, n.enum) || (spec.Doc != "" && prev.spec.Doc != "" && spec.Doc != prev.spec.Doc) {
			return nil, fmt.Errorf("%s: enum %s differs from the one at %s", n.path, spec.Name, prev.where)
		}
		if !dryRun {
			prev.files[m.curFile] = true
		}
		return prev, nil
	}
	e := &enumType{spec: spec, values: n.enum, goType: spec.Name, where: m.curFile + " " + n.path, files: map[string]bool{m.curFile: true}}
	switch spec.Type {
	case "", spec.Name:
	case "string":
		e.goType = "string"
	default:
		return nil, fmt.Errorf("%s: x-floodgate-enum type is the name or \"string\", got %q", n.path, spec.Type)
	}
	e.list = spec.List
	e.id = "enum" + spec.Name
	e.doc = spec.Doc
	if e.doc == "" {
		e.doc = fmt.Sprintf("%s is a value of %s: %s", spec.Name, n.path, n.desc)
	}
	if dryRun {
		return e, nil
	}
	for _, name := range e.names() {
		if err := m.claim(name, e); err != nil {
			return nil, fmt.Errorf("%s: %w", n.path, err)
		}
	}
	m.enums = append(m.enums, e)
	return e, nil
}

// names are the Go identifiers an enum declares.
func (e *enumType) names() []string {
	out := []string{e.id}
	if e.list != "" {
		out = append(out, e.list)
	}
	if e.goType != "string" {
		out = append(out, e.goType)
	}
	if e.spec.Prefix != "" {
		for _, v := range e.values {
			out = append(out, e.spec.Prefix+goName(v))
		}
	}
	return out
}

func isPlainASCII(s string) bool {
	for i := 0; i < len(s); i++ {
		if c := s[i]; c < 0x20 || c > 0x7e || c == '"' || c == '\\' || c == '`' {
			return false
		}
	}
	return true
}

// initialisms are spelled in capitals in Go names.
var initialisms = map[string]string{"id": "ID", "ip": "IP", "ips": "IPs", "ts": "TS", "cpu": "CPU", "api": "API", "url": "URL", "ttl": "TTL", "http": "HTTP"}

// goName turns snake_case into a Go name: distinct_ip24 → DistinctIP24,
// api_key → APIKey.
func goName(s string) string {
	var b strings.Builder
	for _, w := range strings.FieldsFunc(s, func(r rune) bool { return r == '_' || r == '-' || r == '.' }) {
		word := strings.TrimRight(w, "0123456789")
		digits := w[len(word):]
		if up, ok := initialisms[strings.ToLower(word)]; ok {
			b.WriteString(up + digits)
			continue
		}
		b.WriteString(strings.ToUpper(w[:1]) + w[1:])
	}
	return b.String()
}
