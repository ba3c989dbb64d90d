package web

import (
	"embed"
	"encoding/json"
	"fmt"
	"html/template"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

//go:embed templates/*.html
var templateFS embed.FS

// parseTemplates parses each page with the layout (and the alerts page with
// its rows, which the page polls for alone).
func parseTemplates() (map[string]*template.Template, error) {
	pages := map[string]*template.Template{}
	funcs := template.FuncMap{
		"ts":    func(t time.Time) string { return fmtTime(t) },
		"tsms":  func(ms int64) string { return fmtTime(time.UnixMilli(ms)) },
		"tssec": func(s int64) string { return fmtTime(time.Unix(s, 0)) },
		"rate":  func(f float64) string { return strconv.FormatFloat(f, 'f', 2, 64) },
		"num":   func(f float64) string { return strconv.FormatFloat(f, 'f', -1, 64) },
		"q":     url.QueryEscape,
		"can":   func(r auth.Role, need string) bool { n, _ := auth.ParseRole(need); return r.Allows(n) },
		"plink": func(key string) string {
			kind, id, _ := strings.Cut(key, ":")
			return "/principals/" + url.PathEscape(kind) + "/" + url.PathEscape(id)
		},
		"pct":       func(f float64) string { return strconv.FormatFloat(100*f, 'f', 1, 64) + " %" },
		"statusfr":  func(s string) string { return strings.ReplaceAll(s, "_", " ") },
		"slicefrac": func(bp int64) float64 { return float64(bp) / 10000 },
		"tsmilli":   func(t time.Time) string { return t.UTC().Format("2006-01-02 15:04:05.000Z") },
		"cidrof":    func(pk string) string { return strings.TrimPrefix(pk, store.AllowCIDRPrefix) },
		"maxreason": func() int { return store.MaxReason },
		"dims":      whatIfDims,
	}
	for _, page := range []string{"login", "alerts", "alert", "rows", "scales", "fps", "error", "principal", "adjuster", "dlq", "dlqrecord", "blockrate", "overrides", "dlqpurge", "allowlist", "whatif", "rollouts", "deferred", "precision", "proposals"} {
		files := []string{"templates/layout.html", "templates/" + page + ".html"}
		if page == "alerts" {
			files = append(files, "templates/rows.html")
		}
		t, err := template.New("layout.html").Funcs(funcs).ParseFS(templateFS, files...)
		if err != nil {
			return nil, fmt.Errorf("parse template %s: %w", page, err)
		}
		pages[page] = t
	}
	return pages, nil
}

func wantsJSON(r *http.Request) bool {
	return strings.HasPrefix(r.URL.Path, "/api/") || auth.BearerToken(r.Header.Get("Authorization")) != "" ||
		strings.Contains(r.Header.Get("Accept"), "application/json")
}

func (s *Server) fail(w http.ResponseWriter, r *http.Request, code int, msg string) {
	if wantsJSON(r) { // an RFC 9457 problem
		httpapi.WriteProblem(w, r, httpapi.Problem{Type: problemType(code), Status: code, Detail: msg})
		return
	}
	w.WriteHeader(code)
	s.render(w, r, "error", map[string]any{"Title": http.StatusText(code), "Code": code, "Message": msg})
}

// problemTypes are the problem types of the console API's refusals.
var problemTypes = map[int]string{
	http.StatusBadRequest:          httpapi.ProblemInvalidRequest,
	http.StatusUnauthorized:        httpapi.ProblemUnauthenticated,
	http.StatusForbidden:           httpapi.ProblemForbidden,
	http.StatusNotFound:            httpapi.ProblemNotFound,
	http.StatusConflict:            httpapi.ProblemConflict,
	http.StatusUnprocessableEntity: httpapi.ProblemUnprocessable,
	http.StatusTooManyRequests:     httpapi.ProblemTooManyRequests,
	http.StatusBadGateway:          httpapi.ProblemBadGateway,
	http.StatusServiceUnavailable:  httpapi.ProblemUnavailable,
}

// problemType is the problem type of a console API refusal.
func problemType(code int) string {
	if t, ok := problemTypes[code]; ok {
		return t
	}
	if code >= 500 {
		return httpapi.ProblemInternal
	}
	return "about:blank"
}

func writeJSON(w http.ResponseWriter, code int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(code)
	_ = json.NewEncoder(w).Encode(v)
}

type page struct {
	Title string
	Who   auth.Identity
	CSRF  string
	Nav   string
	Data  any
}

func (s *Server) render(w http.ResponseWriter, r *http.Request, name string, data any) {
	req := current(r)
	p := page{Who: req.who, Nav: name, Data: data}
	if req.sess != nil {
		p.CSRF = req.sess.CSRF
	}
	if m, ok := data.(map[string]any); ok {
		p.Title, _ = m["Title"].(string)
	}
	if w.Header().Get("Content-Type") == "" {
		w.Header().Set("Content-Type", "text/html; charset=utf-8")
	}
	tmpl := "layout.html"
	if name == "rows" {
		tmpl = "rows"
	}
	if err := s.pages[name].ExecuteTemplate(w, tmpl, p); err != nil {
		s.cfg.Log.Error("render page", "page", name, "err", err)
	}
}
func fmtTime(t time.Time) string {
	if t.IsZero() {
		return "—"
	}
	return t.UTC().Format("2006-01-02 15:04:05Z")
}
