// Package openapitest holds a service's HTTP API to its OpenAPI 3.1 document
// (schemas/openapi): the document is valid OpenAPI 3.1, the routes a
// handler serves are exactly the document's operations, the document's
// request examples match their schemas, and real requests and answers
// match the document. Only tests import it (it links an OpenAPI validator,
// pb33f/libopenapi-validator, which checks 3.1 documents against the 3.1
// meta-schema and bodies with JSON Schema 2020-12).
package openapitest

import (
	"bytes"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/http/httptest"
	"net/http/httputil"
	"net/url"
	"regexp"
	"slices"
	"strings"
	"sync"
	"testing"

	"github.com/pb33f/libopenapi"
	validator "github.com/pb33f/libopenapi-validator"
	"github.com/pb33f/libopenapi-validator/config"
	verrors "github.com/pb33f/libopenapi-validator/errors"
)

var methods = []string{"get", "put", "post", "delete", "patch", "head", "options", "trace"}

// Doc is a loaded document and what a test has exercised of it.
type Doc struct {
	mu   sync.Mutex // guards hits (Transport may be used concurrently)
	src  []byte     // the document as loaded
	raw  map[string]any
	v    validator.Validator
	ops  map[string]map[string]any // "GET /v1/x" → the operation
	hits map[string]map[int]bool   // operation → answered statuses
}

// Load parses doc (JSON), fails t unless it is a valid OpenAPI 3.1 document,
// and returns it.
func Load(t testing.TB, doc []byte) *Doc {
	t.Helper()
	d, err := Parse(doc)
	if err != nil {
		t.Fatal(err)
	}
	return d
}

// Parse is Load without a test: an error says what is invalid.
func Parse(doc []byte) (*Doc, error) {
	d := &Doc{src: doc, ops: map[string]map[string]any{}, hits: map[string]map[int]bool{}}
	if err := json.Unmarshal(doc, &d.raw); err != nil {
		return nil, fmt.Errorf("openapi document: %w", err)
	}
	if v, _ := d.raw["openapi"].(string); !strings.HasPrefix(v, "3.1.") {
		return nil, fmt.Errorf("openapi document: openapi %q, want 3.1.x", v)
	}
	ld, err := libopenapi.NewDocument(doc)
	if err != nil {
		return nil, fmt.Errorf("openapi document: %w", err)
	}
	v, errs := validator.NewValidator(ld, config.WithFormatAssertions())
	if len(errs) > 0 {
		return nil, fmt.Errorf("openapi document: %w", joinErrs(errs))
	}
	if ok, verrs := v.ValidateDocument(); !ok {
		return nil, fmt.Errorf("openapi document is not valid OpenAPI 3.1: %s", describe(verrs))
	}
	d.v = v
	if err := d.checkSecurity(); err != nil {
		return nil, err
	}
	paths, _ := d.raw["paths"].(map[string]any)
	for p, item := range paths {
		pi, err := d.resolve(item)
		if err != nil {
			return nil, fmt.Errorf("path %s: %w", p, err)
		}
		for _, m := range methods {
			if op, ok := pi[m].(map[string]any); ok {
				d.ops[strings.ToUpper(m)+" "+p] = op
			}
		}
	}
	return d, nil
}

func joinErrs(errs []error) error {
	var b strings.Builder
	for _, e := range errs {
		b.WriteString(e.Error() + "; ")
	}
	return fmt.Errorf("%s", strings.TrimSuffix(b.String(), "; "))
}

// resolve follows a local $ref (#/a/b/c).
func (d *Doc) resolve(v any) (map[string]any, error) {
	m, _ := v.(map[string]any)
	for range 10 {
		ref, ok := m["$ref"].(string)
		if !ok {
			return m, nil
		}
		var cur any = d.raw
		for _, seg := range strings.Split(strings.TrimPrefix(ref, "#/"), "/") {
			seg = strings.ReplaceAll(strings.ReplaceAll(seg, "~1", "/"), "~0", "~")
			cm, _ := cur.(map[string]any)
			cur = cm[seg]
		}
		if m, ok = cur.(map[string]any); !ok {
			return nil, fmt.Errorf("$ref %s: not found", ref)
		}
	}
	return nil, fmt.Errorf("$ref loop")
}

// Operations lists the document's operations as "METHOD /path", sorted.
func (d *Doc) Operations() []string { return slices.Sorted(maps.Keys(d.ops)) }

var (
	wildcard = regexp.MustCompile(`\{([A-Za-z_][A-Za-z0-9_]*)\.\.\.\}`)
)

// Operation turns a ServeMux pattern into the document's form:
// "GET /v1/x/{id}" stays, "{name...}" becomes "{name}", "{$}" goes, and a
// subtree pattern "/static/" becomes "/static/{path}". A pattern without a
// method becomes "* /path", which no document has: document the method.
func Operation(pattern string) string {
	method, path, ok := strings.Cut(pattern, " ")
	if !ok {
		method, path = "*", pattern
	}
	path = wildcard.ReplaceAllString(strings.TrimSpace(path), "{$1}")
	switch {
	case strings.HasSuffix(path, "/{$}"):
		path = strings.TrimSuffix(path, "{$}")
	case path != "/" && strings.HasSuffix(path, "/"):
		path += "{path}"
	}
	return method + " " + path
}

// CheckRoutes fails t unless the patterns served (httpapi.Routes of the
// handler a service mounts) are exactly the document's operations, naming
// what is served but undocumented and documented but not served.
func (d *Doc) CheckRoutes(t testing.TB, served []string) {
	t.Helper()
	if len(served) == 0 {
		t.Fatal("no served routes: the handler does not list its routes (register them on an httpapi.Mux)")
	}
	got := map[string]bool{}
	for _, p := range served {
		got[Operation(p)] = true
	}
	var undocumented, unserved []string
	for op := range got {
		if d.ops[op] == nil {
			undocumented = append(undocumented, op)
		}
	}
	for op := range d.ops {
		if !got[op] {
			unserved = append(unserved, op)
		}
	}
	slices.Sort(undocumented)
	slices.Sort(unserved)
	if len(undocumented) > 0 {
		t.Errorf("served but not in the OpenAPI document: %s", strings.Join(undocumented, ", "))
	}
	if len(unserved) > 0 {
		t.Errorf("in the OpenAPI document but not served: %s", strings.Join(unserved, ", "))
	}
}

// CheckExamples fails t unless every request body of the document has an
// example and every example validates against its operation's schema. It
// returns how many it checked.
func (d *Doc) CheckExamples(t testing.TB) int {
	t.Helper()
	n := 0
	for _, key := range d.Operations() {
		op := d.ops[key]
		rb, err := d.resolve(op["requestBody"])
		if err != nil {
			t.Errorf("%s: requestBody: %v", key, err)
			continue
		}
		content, _ := rb["content"].(map[string]any)
		for mt, media := range content {
			mm, _ := media.(map[string]any)
			var examples []any
			if ex, ok := mm["example"]; ok {
				examples = append(examples, ex)
			}
			exs, _ := mm["examples"].(map[string]any)
			for _, name := range slices.Sorted(maps.Keys(exs)) {
				e, err := d.resolve(exs[name])
				if err != nil {
					t.Errorf("%s: example %s: %v", key, name, err)
					continue
				}
				if v, ok := e["value"]; ok {
					examples = append(examples, v)
				}
			}
			if len(examples) == 0 {
				t.Errorf("%s %s: the request body has no example", key, mt)
			}
			for i, ex := range examples {
				body, err := encodeExample(mt, ex)
				if err != nil {
					t.Errorf("%s %s example %d: %v", key, mt, i, err)
					continue
				}
				method, path, _ := strings.Cut(key, " ")
				req, _ := http.NewRequest(method, "http://example.test"+fillPath(path), bytes.NewReader(body))
				req.Header.Set("Content-Type", mt)
				if ok, errs := d.v.GetRequestBodyValidator().ValidateRequestBody(req); !ok {
					t.Errorf("%s %s example %d does not match its schema: %s", key, mt, i, describe(errs))
				}
				n++
			}
		}
	}
	return n
}

func encodeExample(mediaType string, ex any) ([]byte, error) {
	if strings.Contains(mediaType, "json") {
		return json.Marshal(ex)
	}
	if m, ok := ex.(map[string]any); ok && mediaType == "application/x-www-form-urlencoded" {
		form := url.Values{}
		for k, v := range m {
			form.Set(k, fmt.Sprint(v))
		}
		return []byte(form.Encode()), nil
	}
	s, ok := ex.(string)
	if !ok {
		return nil, fmt.Errorf("a %s example must be a string", mediaType)
	}
	return []byte(s), nil
}

var param = regexp.MustCompile(`\{[^}]+\}`)

func fillPath(p string) string { return param.ReplaceAllString(p, "x") }

// Request is one call a test makes.
type Request struct {
	Method, Path string
	Header       http.Header
	Body         string
	// Invalid says the request deliberately breaks the document (a refusal
	// test): it must then fail request validation; its answer must still
	// match the document.
	Invalid bool
}

// Response is what came back, body read.
type Response struct {
	Status int
	Header http.Header
	Body   []byte
}

// JSON decodes the body into a map (fails t if it is not an object).
func (r Response) JSON(t testing.TB) map[string]any {
	t.Helper()
	var m map[string]any
	if err := json.Unmarshal(r.Body, &m); err != nil {
		t.Fatalf("answer is not a JSON object: %v: %s", err, r.Body)
	}
	return m
}

// Do sends req to the server at base (a real one: httptest.NewServer over
// TCP) and fails t unless the request (unless req.Invalid) and the answer
// match the document: path, parameters, bodies, status, headers.
func (d *Doc) Do(t testing.TB, client *http.Client, base string, req Request) Response {
	t.Helper()
	if client == nil {
		client = http.DefaultClient
	}
	build := func() *http.Request {
		var body io.Reader = http.NoBody
		if req.Body != "" {
			body = strings.NewReader(req.Body)
		}
		r, err := http.NewRequest(req.Method, base+req.Path, body)
		if err != nil {
			t.Fatal(err)
		}
		for k, vs := range req.Header {
			r.Header[k] = vs
		}
		return r
	}
	ok, errs := d.v.ValidateHttpRequest(build())
	switch {
	case req.Invalid && ok:
		t.Errorf("%s %s is marked Invalid but matches the document", req.Method, req.Path)
	case !req.Invalid && !ok:
		t.Errorf("request %s %s does not match the document: %s", req.Method, req.Path, describe(errs))
	}
	res, err := client.Do(build())
	if err != nil {
		t.Fatalf("%s %s: %v", req.Method, req.Path, err)
	}
	body, err := io.ReadAll(res.Body)
	_ = res.Body.Close()
	if err != nil {
		t.Fatalf("%s %s: read answer: %v", req.Method, req.Path, err)
	}
	out := Response{Status: res.StatusCode, Header: res.Header, Body: body}
	if key := d.match(req.Method, req.Path); key != "" {
		d.mu.Lock()
		if d.hits[key] == nil {
			d.hits[key] = map[int]bool{}
		}
		d.hits[key][res.StatusCode] = true
		d.mu.Unlock()
	}
	res.Body = io.NopCloser(bytes.NewReader(body))
	if ok, errs := d.v.ValidateHttpResponse(build(), res); !ok {
		t.Errorf("answer to %s %s (%d) does not match the document: %s\nbody: %.600s", req.Method, req.Path, res.StatusCode, describe(errs), body)
	}
	return out
}

// Transport returns a RoundTripper (over base, nil: http.DefaultTransport)
// for tests that already make their calls: every answer must match the
// document, and a request the document says is invalid must be refused
// with a 4xx. Failures are reported on t; calls count for CheckCovered.
func (d *Doc) Transport(t testing.TB, base http.RoundTripper) http.RoundTripper {
	if base == nil {
		base = http.DefaultTransport
	}
	return roundTripper(func(req *http.Request) (*http.Response, error) {
		var reqBody []byte
		if req.Body != nil && req.Body != http.NoBody {
			b, err := io.ReadAll(req.Body)
			_ = req.Body.Close()
			if err != nil {
				return nil, err
			}
			reqBody = b
		}
		clone := func() *http.Request {
			r := req.Clone(req.Context())
			r.Body = io.NopCloser(bytes.NewReader(reqBody))
			if reqBody == nil {
				r.Body = http.NoBody
			}
			return r
		}
		reqOK, reqErrs := d.v.ValidateHttpRequest(clone())
		res, err := base.RoundTrip(clone())
		if err != nil {
			return nil, err
		}
		body, err := io.ReadAll(res.Body)
		_ = res.Body.Close()
		if err != nil {
			return nil, err
		}
		path := req.URL.Path
		if key := d.match(req.Method, path); key != "" {
			d.mu.Lock()
			if d.hits[key] == nil {
				d.hits[key] = map[int]bool{}
			}
			d.hits[key][res.StatusCode] = true
			d.mu.Unlock()
		}
		if !reqOK && (res.StatusCode < 400 || res.StatusCode >= 500) {
			t.Errorf("request %s %s does not match the document, yet was answered %d: %s", req.Method, req.URL.RequestURI(), res.StatusCode, describe(reqErrs))
		}
		check := *res
		check.Body = io.NopCloser(bytes.NewReader(body))
		if ok, errs := d.v.ValidateHttpResponse(clone(), &check); !ok {
			t.Errorf("answer to %s %s (%d) does not match the document: %s\nbody: %.600s", req.Method, req.URL.RequestURI(), res.StatusCode, describe(errs), body)
		}
		res.Body = io.NopCloser(bytes.NewReader(body))
		return res, nil
	})
}

// Proxy starts a reverse proxy to target whose answers are checked as
// Transport checks them, for tests whose calls come from code they cannot
// hand a client to (a CLI): point it at the returned URL.
func (d *Doc) Proxy(t testing.TB, target string) string {
	u, err := url.Parse(target)
	if err != nil {
		t.Fatal(err)
	}
	p := &httputil.ReverseProxy{
		Rewrite:   func(r *httputil.ProxyRequest) { r.SetURL(u); r.Out.Host = r.In.Host },
		Transport: d.Transport(t, nil),
	}
	srv := httptest.NewServer(p)
	t.Cleanup(srv.Close)
	return srv.URL
}

type roundTripper func(*http.Request) (*http.Response, error)

func (f roundTripper) RoundTrip(r *http.Request) (*http.Response, error) { return f(r) }

// match finds the operation a request is for (literal segments first).
func (d *Doc) match(method, path string) string {
	path, _, _ = strings.Cut(path, "?")
	best, bestLit := "", -1
	for key := range d.ops {
		m, p, _ := strings.Cut(key, " ")
		if m != method {
			continue
		}
		if lit, ok := matchPath(p, path); ok && lit > bestLit {
			best, bestLit = key, lit
		}
	}
	return best
}

func matchPath(tmpl, path string) (int, bool) {
	ts, ps := strings.Split(tmpl, "/"), strings.Split(path, "/")
	if len(ts) != len(ps) {
		if !(len(ts) < len(ps) && ts[len(ts)-1] == "{path}") {
			return 0, false
		}
	}
	lit := 0
	for i, s := range ts {
		if strings.HasPrefix(s, "{") {
			continue
		}
		if s != ps[i] {
			return 0, false
		}
		lit++
	}
	return lit, true
}

// CheckCovered fails t unless every operation was called at least once, so
// that no part of the document goes untested; it logs the documented
// statuses that no call produced.
func (d *Doc) CheckCovered(t testing.TB) {
	t.Helper()
	d.mu.Lock()
	defer d.mu.Unlock()
	for _, key := range d.Operations() {
		if len(d.hits[key]) == 0 {
			t.Errorf("%s: never called; exercise it in the test", key)
		}
		resp, _ := d.ops[key]["responses"].(map[string]any)
		var missed []string
		for code := range resp {
			var n int
			if _, err := fmt.Sscanf(code, "%d", &n); err == nil && !d.hits[key][n] {
				missed = append(missed, code)
			}
		}
		if len(missed) > 0 {
			slices.Sort(missed)
			t.Logf("%s: documented statuses no call produced: %s", key, strings.Join(missed, ", "))
		}
	}
}

func describe(errs []*verrors.ValidationError) string {
	var b strings.Builder
	for _, e := range errs {
		fmt.Fprintf(&b, "\n  - %s: %s", e.Message, e.Reason)
		for _, s := range e.SchemaValidationErrors {
			fmt.Fprintf(&b, "\n      %s %s", s.FieldPath, s.Reason)
		}
	}
	return b.String()
}

// checkSecurity: every scheme a security requirement names is defined (the
// meta-schema cannot tell).
func (d *Doc) checkSecurity() error {
	comps, _ := d.raw["components"].(map[string]any)
	schemes, _ := comps["securitySchemes"].(map[string]any)
	check := func(where string, v any) error {
		reqs, _ := v.([]any)
		for _, r := range reqs {
			m, _ := r.(map[string]any)
			for name := range m {
				if _, ok := schemes[name]; !ok {
					return fmt.Errorf("openapi document: %s: security scheme %q is not in components.securitySchemes", where, name)
				}
			}
		}
		return nil
	}
	if err := check("security", d.raw["security"]); err != nil {
		return err
	}
	paths, _ := d.raw["paths"].(map[string]any)
	for p, item := range paths {
		pi, err := d.resolve(item)
		if err != nil {
			return err
		}
		for _, m := range methods {
			if op, ok := pi[m].(map[string]any); ok {
				if err := check(strings.ToUpper(m)+" "+p, op["security"]); err != nil {
					return err
				}
			}
		}
	}
	return nil
}
