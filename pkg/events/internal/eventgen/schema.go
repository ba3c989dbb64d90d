package eventgen

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"os"
	"path/filepath"
	"sort"
	"strings"
)

// object is a JSON object that remembers the order of its members: struct
// fields, and so encoding order, follow the order of a schema's properties.
type object struct {
	keys []string
	vals map[string]any
}

func (o *object) get(k string) (any, bool) {
	v, ok := o.vals[k]
	return v, ok
}

// readJSON parses one JSON document keeping member order (objects become
// *object) and numbers exact (json.Number).
func readJSON(data []byte) (any, error) {
	dec := json.NewDecoder(bytes.NewReader(data))
	dec.UseNumber()
	v, err := readValue(dec)
	if err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, fmt.Errorf("data after the top-level value")
	}
	return v, nil
}

func readValue(dec *json.Decoder) (any, error) {
	tok, err := dec.Token()
	if err != nil {
		return nil, err
	}
	switch tok {
	case json.Delim('{'):
		o := &object{vals: map[string]any{}}
		for dec.More() {
			kt, err := dec.Token()
			if err != nil {
				return nil, err
			}
			k := kt.(string)
			if _, dup := o.vals[k]; dup {
				return nil, fmt.Errorf("duplicate member %q", k)
			}
			v, err := readValue(dec)
			if err != nil {
				return nil, err
			}
			o.keys = append(o.keys, k)
			o.vals[k] = v
		}
		_, err := dec.Token() // '}'
		return o, err
	case json.Delim('['):
		var a []any
		for dec.More() {
			v, err := readValue(dec)
			if err != nil {
				return nil, err
			}
			a = append(a, v)
		}
		_, err := dec.Token() // ']'
		return a, err
	}
	return tok, nil
}

// node is one schema node with its $ref resolved, reduced to what the
// generator reads.
type node struct {
	path    string // JSON path within the event, for messages: "evidence.top_ips[]"
	def     string // the $defs entry it came from, if any
	typ     string // JSON Schema "type"
	desc    string // the description, or the referring property's
	defDesc string // the $defs entry's own description
	constV  string
	hasCon  bool
	enum    []string
	req     []string
	props   []prop
	items   *node
	minLen  *int64
	maxLen  *int64
	maxItem *int64
	min     *json.Number
	exclMin *json.Number
	max     *json.Number

	goType   string    // x-floodgate-go-type
	format   string    // x-floodgate-format
	maxConst string    // x-floodgate-max-const
	enumSpec *enumSpec // x-floodgate-enum
}

type prop struct {
	name string
	n    *node
}

// enumSpec is the x-floodgate-enum keyword.
type enumSpec struct {
	Name   string `json:"name"`   // Go type name, and the base of helper names
	Type   string `json:"type"`   // "string" for a plain string; default Name
	Prefix string `json:"prefix"` // constant names are Prefix+CamelCase(value); none without
	List   string `json:"list"`   // name of the "|"-separated list constant; default nameValues
	Doc    string `json:"doc"`    // Go doc comment of the type
}

// schemaFile is one parsed schemas/*.v1.json.
type schemaFile struct {
	file  string // base name: "decision.v1.json"
	title string // "decision.v1"
	root  *node
}

// loadSchemas reads every *.v1.json (every versioned event schema) in dir.
func loadSchemas(dir string) ([]*schemaFile, error) {
	paths, err := filepath.Glob(filepath.Join(dir, "*.v[0-9]*.json"))
	if err != nil {
		return nil, err
	}
	if len(paths) == 0 {
		return nil, fmt.Errorf("no event schemas (*.vN.json) in %s", dir)
	}
	sort.Strings(paths)
	var out []*schemaFile
	for _, p := range paths {
		data, err := os.ReadFile(p)
		if err != nil {
			return nil, err
		}
		doc, err := readJSON(data)
		if err != nil {
			return nil, fmt.Errorf("%s: %w", p, err)
		}
		root, ok := doc.(*object)
		if !ok {
			return nil, fmt.Errorf("%s: not a JSON object", p)
		}
		sf := &schemaFile{file: filepath.Base(p)}
		sf.title, _ = str(root, "title")
		if sf.title == "" {
			return nil, fmt.Errorf("%s: no title", p)
		}
		var defs *object
		if d, ok := root.get("$defs"); ok {
			defs, _ = d.(*object)
		}
		r := &resolver{file: sf.file, defs: defs}
		if sf.root, err = r.node(root, "", ""); err != nil {
			return nil, fmt.Errorf("%s: %w", sf.file, err)
		}
		out = append(out, sf)
	}
	return out, nil
}

type resolver struct {
	file string
	defs *object
}

func str(o *object, k string) (string, bool) {
	v, ok := o.get(k)
	if !ok {
		return "", false
	}
	s, ok := v.(string)
	return s, ok
}

// number returns member k of o as a json.Number, nil when absent.
func number(o *object, k string) (*json.Number, error) {
	v, ok := o.get(k)
	if !ok {
		return nil, nil
	}
	n, ok := v.(json.Number)
	if !ok {
		return nil, fmt.Errorf("%s is not a number", k)
	}
	return &n, nil
}

func (r *resolver) node(o *object, path, def string) (*node, error) {
	where := path
	if where == "" {
		where = "(root)"
	}
	if ref, ok := str(o, "$ref"); ok {
		name, ok := strings.CutPrefix(ref, "#/$defs/")
		if !ok || r.defs == nil {
			return nil, fmt.Errorf("%s: only local #/$defs/ references are supported, got %q", where, ref)
		}
		target, ok := r.defs.vals[name].(*object)
		if !ok {
			return nil, fmt.Errorf("%s: $ref %q: no such definition", where, ref)
		}
		n, err := r.node(target, path, name)
		if err != nil {
			return nil, err
		}
		// The referring property's own description wins for member docs.
		n.defDesc = n.desc
		if d, ok := str(o, "description"); ok {
			n.desc = d
		}
		return n, nil
	}
	n := &node{path: path, def: def}
	n.typ, _ = str(o, "type")
	n.desc, _ = str(o, "description")
	if c, ok := o.get("const"); ok {
		s, ok := c.(string)
		if !ok {
			return nil, fmt.Errorf("%s: only string constants are supported", where)
		}
		n.constV, n.hasCon, n.typ = s, true, "string"
	}
	if e, ok := o.get("enum"); ok {
		for _, v := range e.([]any) {
			s, ok := v.(string)
			if !ok {
				return nil, fmt.Errorf("%s: only string enums are supported", where)
			}
			n.enum = append(n.enum, s)
		}
	}
	if rq, ok := o.get("required"); ok {
		for _, v := range rq.([]any) {
			n.req = append(n.req, v.(string))
		}
	}
	var bad error
	nums := func(k string) *json.Number {
		v, err := number(o, k)
		if err != nil && bad == nil {
			bad = err
		}
		return v
	}
	ints := func(k string) *int64 {
		n := nums(k)
		if n == nil {
			return nil
		}
		i, err := n.Int64()
		if err != nil && bad == nil {
			bad = fmt.Errorf("%s: %w", k, err)
		}
		return &i
	}
	n.minLen, n.maxLen, n.maxItem = ints("minLength"), ints("maxLength"), ints("maxItems")
	n.min, n.exclMin, n.max = nums("minimum"), nums("exclusiveMinimum"), nums("maximum")
	if bad != nil {
		return nil, fmt.Errorf("%s: %w", where, bad)
	}
	n.goType, _ = str(o, "x-floodgate-go-type")
	n.format, _ = str(o, "x-floodgate-format")
	n.maxConst, _ = str(o, "x-floodgate-max-const")
	if es, ok := o.get("x-floodgate-enum"); ok {
		eo, ok := es.(*object)
		if !ok {
			return nil, fmt.Errorf("%s: x-floodgate-enum must be an object", where)
		}
		spec := &enumSpec{}
		for _, k := range eo.keys {
			s, ok := eo.vals[k].(string)
			if !ok {
				return nil, fmt.Errorf("%s: x-floodgate-enum.%s must be a string", where, k)
			}
			switch k {
			case "name":
				spec.Name = s
			case "type":
				spec.Type = s
			case "prefix":
				spec.Prefix = s
			case "list":
				spec.List = s
			case "doc":
				spec.Doc = s
			default:
				return nil, fmt.Errorf("%s: unknown x-floodgate-enum member %q", where, k)
			}
		}
		n.enumSpec = spec
	}
	for _, k := range o.keys {
		if strings.HasPrefix(k, "x-floodgate-") {
			switch k {
			case "x-floodgate-go-type", "x-floodgate-format", "x-floodgate-max-const", "x-floodgate-enum":
			default:
				return nil, fmt.Errorf("%s: unknown keyword %s", where, k)
			}
		}
	}
	if p, ok := o.get("properties"); ok {
		po := p.(*object)
		for _, name := range po.keys {
			sub := name
			if path != "" {
				sub = path + "." + name
			}
			pn, err := r.node(po.vals[name].(*object), sub, "")
			if err != nil {
				return nil, err
			}
			n.props = append(n.props, prop{name, pn})
		}
	}
	if it, ok := o.get("items"); ok {
		var err error
		if n.items, err = r.node(it.(*object), path+"[]", ""); err != nil {
			return nil, err
		}
	}
	return n, nil
}
