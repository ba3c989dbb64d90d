// Package openapi holds the OpenAPI 3.1 documents of Floodgate's HTTP APIs,
// one per service (<service>.yaml), and common.yaml, the parts they share:
// RFC 9457 problem details and Floodgate's problem types, the X-Request-Id
// correlation header, the bearer-token security scheme, the rate-limit
// headers and the operational endpoints. A service document refers to them
// as common.yaml#/components/…; JSON bundles a document into one
// self-contained file, which each service serves at httpapi.OpenAPIPath.
package openapi

import (
	"embed"
	"encoding/json"
	"fmt"
	"slices"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

//go:embed *.yaml
var files embed.FS

// The documents, by service.
const (
	Limiter    = "limiter"
	Quota      = "quota"
	Adjuster   = "adjuster"
	DLQAuditor = "dlq-auditor"
	Console    = "console"
)

// Names lists every service document.
func Names() []string { return []string{Limiter, Quota, Adjuster, DLQAuditor, Console} }

const commonFile = "common.yaml"

// YAML returns a document as it is in the repository (common.yaml
// references unresolved).
func YAML(name string) ([]byte, error) {
	if !slices.Contains(Names(), name) && name != "common" {
		return nil, fmt.Errorf("openapi: no document %q (want one of %s)", name, strings.Join(Names(), ", "))
	}
	return files.ReadFile(name + ".yaml")
}

// JSON returns the named document bundled: every component of common.yaml
// it uses (directly or through other components) copied into its
// components, the references made local.
func JSON(name string) ([]byte, error) {
	raw, err := YAML(name)
	if err != nil {
		return nil, err
	}
	doc, err := decode(name+".yaml", raw)
	if err != nil {
		return nil, err
	}
	craw, err := files.ReadFile(commonFile)
	if err != nil {
		return nil, err
	}
	common, err := decode(commonFile, craw)
	if err != nil {
		return nil, err
	}
	need := map[string]bool{}
	doc = localize(doc, commonFile, need).(map[string]any)
	comps, _ := doc["components"].(map[string]any)
	if comps == nil {
		comps = map[string]any{}
		doc["components"] = comps
	}
	// Security requirements name schemes without a $ref: take the ones the
	// document does not define from common.yaml.
	own, _ := comps["securitySchemes"].(map[string]any)
	for _, scheme := range securityNames(doc) {
		if _, ok := own[scheme]; !ok {
			need["#/components/securitySchemes/"+scheme] = true
		}
	}
	done := map[string]bool{}
	for len(need) > len(done) {
		for _, ptr := range slices.Sorted(mapKeys(need)) {
			if done[ptr] {
				continue
			}
			done[ptr] = true
			kind, cname, ok := strings.Cut(strings.TrimPrefix(ptr, "#/components/"), "/")
			if !ok || strings.Contains(cname, "/") {
				return nil, fmt.Errorf("openapi %s: reference %s: only whole components of %s can be used", name, ptr, commonFile)
			}
			src, _ := common["components"].(map[string]any)
			km, _ := src[kind].(map[string]any)
			c, ok := km[cname]
			if !ok {
				return nil, fmt.Errorf("openapi %s: %s%s does not exist", name, commonFile, ptr)
			}
			// common.yaml's own references are local to it: follow them too.
			c = localize(c, "", need)
			dst, _ := comps[kind].(map[string]any)
			if dst == nil {
				dst = map[string]any{}
				comps[kind] = dst
			}
			// A service document names a shared security scheme by a $ref to
			// common.yaml (security requirements are names, not references):
			// that entry gives way to the scheme itself.
			if own, ok := dst[cname].(map[string]any); ok && len(own) == 1 && own["$ref"] == ptr {
				delete(dst, cname)
			}
			if _, clash := dst[cname]; clash {
				return nil, fmt.Errorf("openapi %s: components.%s.%s is defined both here and in %s", name, kind, cname, commonFile)
			}
			dst[cname] = c
		}
	}
	return json.MarshalIndent(doc, "", "  ")
}

func mapKeys(m map[string]bool) func(func(string) bool) {
	return func(yield func(string) bool) {
		for k := range m {
			if !yield(k) {
				return
			}
		}
	}
}

func decode(file string, b []byte) (map[string]any, error) {
	var v map[string]any
	if err := yaml.Unmarshal(b, &v); err != nil {
		return nil, fmt.Errorf("openapi %s: %w", file, err)
	}
	out, err := jsonable(v)
	if err != nil {
		return nil, fmt.Errorf("openapi %s: %w", file, err)
	}
	return out.(map[string]any), nil
}

// jsonable turns what YAML decoded into what JSON encodes the same way:
// timestamps back to text, and no non-string keys.
func jsonable(v any) (any, error) {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			j, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			x[k] = j
		}
	case map[any]any:
		return nil, fmt.Errorf("a mapping with a non-string key (quote status codes: \"200\")")
	case []any:
		for i, e := range x {
			j, err := jsonable(e)
			if err != nil {
				return nil, err
			}
			x[i] = j
		}
	case time.Time:
		return x.Format(time.RFC3339Nano), nil
	}
	return v, nil
}

// localize rewrites every $ref to file#/components/… (or, with file "", to
// #/components/…) as #/components/… and records it in need.
func localize(v any, file string, need map[string]bool) any {
	switch x := v.(type) {
	case map[string]any:
		for k, e := range x {
			if ref, ok := e.(string); ok && k == "$ref" {
				if ptr, ok := strings.CutPrefix(ref, file+"#/components/"); ok {
					x[k] = "#/components/" + ptr
					need["#/components/"+ptr] = true
				}
				continue
			}
			x[k] = localize(e, file, need)
		}
	case []any:
		for i, e := range x {
			x[i] = localize(e, file, need)
		}
	}
	return v
}

// securityNames lists the schemes the document's security requirements
// name, at the top and on every operation.
func securityNames(doc map[string]any) []string {
	var names []string
	add := func(v any) {
		reqs, _ := v.([]any)
		for _, r := range reqs {
			m, _ := r.(map[string]any)
			for k := range m {
				if !slices.Contains(names, k) {
					names = append(names, k)
				}
			}
		}
	}
	add(doc["security"])
	paths, _ := doc["paths"].(map[string]any)
	for _, item := range paths {
		pi, _ := item.(map[string]any)
		for _, op := range pi {
			if m, ok := op.(map[string]any); ok {
				add(m["security"])
			}
		}
	}
	slices.Sort(names)
	return names
}
