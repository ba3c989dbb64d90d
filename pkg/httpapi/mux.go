package httpapi

import (
	"crypto/sha256"
	"encoding/hex"
	"net/http"
	"path"
	"slices"
	"strings"
)

// Mux is an http.ServeMux that remembers the patterns it was given, so a
// test can compare what a service serves with its OpenAPI document
// (schemas/openapi). Register routes before serving; it is then safe for
// concurrent use, as http.ServeMux is.
type Mux struct {
	mux    http.ServeMux
	routes []muxRoute
	known  knownRoutes // requests that surely match a pattern (ServeHTTP)
}

// knownRoutes tells, without a routing lookup, that a request matches one
// of a Mux's patterns, so ServeHTTP need not look it up twice (once to
// know whether it matches, once to serve it: each lookup costs about as
// much as the rest of the mux, allocations included). It answers only
// what it is sure of; otherwise the Mux asks http.ServeMux.
type knownRoutes struct {
	// all: a method-less, host-less "/" is registered, so every request
	// but CONNECT (matched against its host, not its path) matches.
	all bool
	// exact: the methods ("" for any) of each host-less pattern without
	// wildcards, by its clean path.
	exact map[string][]string
}

// add records pattern (http.ServeMux's syntax: "[METHOD ][HOST]/[PATH]").
func (k *knownRoutes) add(pattern string) {
	method, p := "", pattern
	if i := strings.IndexAny(pattern, " \t"); i >= 0 {
		method, p = pattern[:i], strings.TrimLeft(pattern[i:], " \t")
	}
	switch {
	case p == "/" && method == "":
		k.all = true
	case !strings.HasPrefix(p, "/") || strings.ContainsAny(p, "{}%") || strings.HasSuffix(p, "/") || path.Clean(p) != p:
		// A host, a wildcard, an escape or a subtree: matched by more than its path.
	default:
		if k.exact == nil {
			k.exact = map[string][]string{}
		}
		k.exact[p] = append(k.exact[p], method)
	}
}

// matches reports whether r surely matches a recorded pattern.
func (k *knownRoutes) matches(r *http.Request) bool {
	if r.Method == http.MethodConnect {
		return false
	}
	if k.all {
		return true
	}
	if r.URL.RawPath != "" {
		return false
	}
	for _, m := range k.exact[r.URL.Path] {
		if m == "" || m == r.Method || m == http.MethodGet && r.Method == http.MethodHead {
			return true
		}
	}
	return false
}

type muxRoute struct {
	pattern string
	h       http.Handler
}

// NewMux returns an empty Mux.
func NewMux() *Mux { return &Mux{} }

// Handle registers h for pattern (http.ServeMux's pattern syntax).
func (m *Mux) Handle(pattern string, h http.Handler) {
	m.mux.Handle(pattern, h)
	m.routes = append(m.routes, muxRoute{pattern: pattern, h: h})
	m.known.add(pattern)
}

// HandleFunc registers h for pattern.
func (m *Mux) HandleFunc(pattern string, h func(http.ResponseWriter, *http.Request)) {
	m.Handle(pattern, http.HandlerFunc(h))
}

// OnlyGET answers every method on path but GET and HEAD with a 405 problem
// (Allow: GET, HEAD). A mux that mounts an API at "/" needs it for its own
// GET routes: http.ServeMux would hand another method on them to the mount,
// which answers 404 for a path it does not know. Not listed in Routes.
func (m *Mux) OnlyGET(path string) {
	m.mux.HandleFunc(path, func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Allow", "GET, HEAD")
		WriteProblem(w, r, Problem{Type: ProblemMethodNotAllowed, Status: http.StatusMethodNotAllowed, Detail: r.Method + " " + r.URL.Path})
	})
	m.known.add(path)
}

// ServeHTTP implements http.Handler. A request no pattern matches is
// answered as a problem (404 not-found, 405 method-not-allowed with its
// Allow header), as every other refusal is, never as text/plain.
func (m *Mux) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	if !m.known.matches(r) {
		if _, pattern := m.mux.Handler(r); pattern == "" {
			w = &unmatched{ResponseWriter: w, r: r}
		}
	}
	m.mux.ServeHTTP(w, r)
}

// unmatched turns http.ServeMux's plain-text 404 and 405 into problems.
type unmatched struct {
	http.ResponseWriter
	r       *http.Request
	swallow bool // the plain-text body that follows is dropped
}

func (u *unmatched) WriteHeader(code int) {
	typ := ProblemNotFound
	switch code {
	case http.StatusNotFound:
	case http.StatusMethodNotAllowed:
		typ = ProblemMethodNotAllowed
	default:
		u.ResponseWriter.WriteHeader(code)
		return
	}
	u.swallow = true
	u.Header().Del("X-Content-Type-Options")
	WriteProblem(u.ResponseWriter, u.r, Problem{Type: typ, Status: code, Detail: u.r.Method + " " + u.r.URL.Path})
}

func (u *unmatched) Write(b []byte) (int, error) {
	if u.swallow {
		return len(b), nil
	}
	return u.ResponseWriter.Write(b)
}

// Routes lists the patterns served, sorted and without repeats. A
// method-less "/" mount of a handler that lists its own routes (a Mux, or
// anything with a Routes method) contributes that handler's routes
// instead: the runner mounts a service's API that way.
func (m *Mux) Routes() []string {
	var out []string
	for _, r := range m.routes {
		if sub, ok := r.h.(interface{ Routes() []string }); ok && r.pattern == "/" {
			out = append(out, sub.Routes()...)
			continue
		}
		out = append(out, r.pattern)
	}
	slices.Sort(out)
	return slices.Compact(out)
}

// Routes lists h's patterns when h can tell them (see Mux.Routes), else nil.
func Routes(h http.Handler) []string {
	if r, ok := h.(interface{ Routes() []string }); ok {
		return r.Routes()
	}
	return nil
}

// OpenAPIPath is where every Floodgate API serves its OpenAPI 3.1 document.
const OpenAPIPath = "/openapi.json"

// OpenAPIHandler serves doc, an OpenAPI document in JSON, with an ETag so
// clients and generators can cache it. It needs no credential: the document
// describes the API, it holds no data.
func OpenAPIHandler(doc []byte) http.Handler {
	sum := sha256.Sum256(doc)
	etag := `"` + hex.EncodeToString(sum[:16]) + `"`
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		h := w.Header()
		h.Set("ETag", etag)
		h.Set("Cache-Control", "no-cache")
		if r.Header.Get("If-None-Match") == etag {
			w.WriteHeader(http.StatusNotModified)
			return
		}
		h.Set("Content-Type", "application/json")
		_, _ = w.Write(doc)
	})
}
