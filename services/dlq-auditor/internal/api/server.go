package api

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"regexp"
	"strconv"
	"strings"
	"time"
	"unicode/utf8"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/auditor"
)

// HeaderCorrelationID carries a request's correlation id; the server accepts
// a well-formed one from the caller and otherwise makes one up.
const HeaderCorrelationID = "X-Correlation-ID"

// Server serves the API. Every /v1 route needs a bearer token; viewer routes
// read, sre routes change (and are audited by the auditor package).
type Server struct {
	Store    *auditor.Store
	Replayer *auditor.Replayer
	Purger   *auditor.Purger
	Checker  *auditor.Checker
	Tokens   *Tokens
	Now      func() time.Time
	NewID    func() string
	Logger   *slog.Logger

	requests *prometheus.CounterVec
}

// NewServer registers the API's metrics on reg.
func NewServer(s Server, reg prometheus.Registerer) *Server {
	s.requests = promauto.With(reg).NewCounterVec(prometheus.CounterOpts{
		Name: "floodgate_dlq_auditor_api_requests_total",
		Help: "API requests by route and status code.",
	}, []string{"route", "code"})
	return &s
}

// Register adds the API's routes to mux.
func (s *Server) Register(mux *http.ServeMux) {
	mux.Handle("GET /v1/records", s.route("list", RoleViewer, s.list))
	mux.Handle("GET /v1/records/{id}", s.route("inspect", RoleViewer, s.inspect))
	mux.Handle("POST /v1/replays", s.route("replay", RoleSRE, s.replay))
	mux.Handle("POST /v1/purges", s.route("purge", RoleSRE, s.purge))
	mux.Handle("GET /v1/completeness", s.route("completeness", RoleViewer, s.completeness))
}

// ErrorBody is every error response: {"error": {...}}.
type ErrorBody struct {
	Error APIError `json:"error"`
}

// APIError describes an error; Code is stable for programs to branch on.
type APIError struct {
	Code          string `json:"code"` // unauthenticated, forbidden, bad_request, not_found, conflict, internal
	Message       string `json:"message"`
	CorrelationID string `json:"correlation_id"`
}

type request struct {
	w       http.ResponseWriter
	r       *http.Request
	who     Principal
	corr    string
	status  int
	written bool
}

func (q *request) json(status int, v any) {
	q.status, q.written = status, true
	q.w.Header().Set("Content-Type", "application/json")
	q.w.WriteHeader(status)
	enc := json.NewEncoder(q.w)
	enc.SetIndent("", "  ")
	_ = enc.Encode(v)
}

func (q *request) fail(status int, code, msg string) {
	q.json(status, ErrorBody{Error: APIError{Code: code, Message: msg, CorrelationID: q.corr}})
}

var correlationID = regexp.MustCompile(`^[A-Za-z0-9._-]{1,64}$`)

func (s *Server) route(name, role string, h func(*request)) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		q := &request{w: w, r: r, corr: r.Header.Get(HeaderCorrelationID)}
		if !correlationID.MatchString(q.corr) {
			q.corr = s.NewID()
		}
		w.Header().Set(HeaderCorrelationID, q.corr)
		defer func() {
			s.requests.WithLabelValues(name, strconv.Itoa(q.status)).Inc()
		}()
		token, ok := strings.CutPrefix(r.Header.Get("Authorization"), "Bearer ")
		who, found := s.Tokens.Lookup(strings.TrimSpace(token))
		if !ok || !found {
			w.Header().Set("WWW-Authenticate", `Bearer realm="floodgate-dlq"`)
			q.fail(http.StatusUnauthorized, "unauthenticated", "a valid API token is required: Authorization: Bearer <token>")
			s.Logger.Warn("api request refused", "route", name, "reason", "unauthenticated", "correlation_id", q.corr)
			return
		}
		q.who = who
		if !who.Allows(role) {
			q.fail(http.StatusForbidden, "forbidden", "role "+who.Role+" may not "+name+"; it needs role "+role)
			s.Logger.Warn("api request refused", "route", name, "actor", who.Name, "role", who.Role, "reason", "forbidden", "correlation_id", q.corr)
			return
		}
		r.Body = http.MaxBytesReader(w, r.Body, 1<<20)
		h(q)
		if !q.written {
			q.fail(http.StatusInternalServerError, "internal", "no response")
		}
		s.Logger.Info("api request", "route", name, "actor", who.Name, "role", who.Role, "status", q.status, "correlation_id", q.corr)
	})
}

// failErr maps an error to its response; unexpected errors are logged with
// the correlation id and answered without their detail.
func (s *Server) failErr(q *request, err error) {
	switch {
	case errors.Is(err, auditor.ErrBadRequest), errors.Is(err, auditor.ErrBadFilter), errors.Is(err, auditor.ErrBadID):
		q.fail(http.StatusBadRequest, "bad_request", err.Error())
	case errors.Is(err, auditor.ErrNotFound):
		q.fail(http.StatusNotFound, "not_found", err.Error())
	case errors.Is(err, auditor.ErrReplayRunning):
		q.fail(http.StatusConflict, "conflict", err.Error())
	default:
		s.Logger.Error("api request failed", "err", err, "correlation_id", q.corr)
		q.fail(http.StatusInternalServerError, "internal", "internal error; quote the correlation id to an operator")
	}
}

func parseTime(q *request, name string, def time.Time) (time.Time, bool) {
	v := q.r.URL.Query().Get(name)
	if v == "" {
		return def, true
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		q.fail(http.StatusBadRequest, "bad_request", name+"="+strconv.Quote(v)+": want an RFC 3339 time such as 2026-01-02T15:04:05Z")
		return time.Time{}, false
	}
	return t, true
}

func (s *Server) list(q *request) {
	now := s.Now()
	to, ok := parseTime(q, "to", now)
	if !ok {
		return
	}
	from, ok := parseTime(q, "from", to.Add(-24*time.Hour))
	if !ok {
		return
	}
	limit := 100
	if v := q.r.URL.Query().Get("limit"); v != "" {
		n, err := strconv.Atoi(v)
		if err != nil {
			q.fail(http.StatusBadRequest, "bad_request", "limit="+strconv.Quote(v)+": want an integer in 1..1000")
			return
		}
		limit = n
	}
	qs := q.r.URL.Query()
	page, err := s.Store.List(q.r.Context(), auditor.Filter{
		Topic: qs.Get("topic"), Service: qs.Get("service"), Class: qs.Get("class"),
		From: from, To: to, Limit: limit, Cursor: qs.Get("cursor"),
	})
	if err != nil {
		s.failErr(q, err)
		return
	}
	if page.Records == nil {
		page.Records = []auditor.Record{}
	}
	q.json(http.StatusOK, page)
}

// Inspection is one record with its payload decoded for reading.
type Inspection struct {
	Record auditor.Record `json:"record"`
	// KeyText and ValueText are the (redacted) key and value as text when they
	// are UTF-8; Payload is the value as JSON when it is JSON.
	KeyText   string               `json:"key_text,omitempty"`
	ValueText string               `json:"value_text,omitempty"`
	Payload   json.RawMessage      `json:"payload,omitempty"`
	Audit     []auditor.AuditEntry `json:"audit"`
}

func (s *Server) inspect(q *request) {
	id := q.r.PathValue("id")
	rec, err := s.Store.Get(q.r.Context(), id)
	if err != nil {
		s.failErr(q, err)
		return
	}
	out := Inspection{Record: rec}
	if utf8.Valid(rec.Key) {
		out.KeyText = string(rec.Key)
	}
	if json.Valid(rec.Value) {
		out.Payload = rec.Value
	} else if utf8.Valid(rec.Value) {
		out.ValueText = string(rec.Value)
	}
	out.Audit, err = s.Store.AuditOf(q.r.Context(), auditor.SubjectOf(rec.ID))
	if err != nil {
		s.failErr(q, err)
		return
	}
	if out.Audit == nil {
		out.Audit = []auditor.AuditEntry{}
	}
	q.json(http.StatusOK, out)
}

// ReplayBody is the body of POST /v1/replays.
type ReplayBody struct {
	IDs    []string `json:"ids"`
	Canary int      `json:"canary"` // default 1
	Rate   float64  `json:"rate"`   // messages per second; default and maximum: the server's
	Reason string   `json:"reason"`
}

// PurgeBody is the body of POST /v1/purges.
type PurgeBody struct {
	IDs    []string `json:"ids"`
	Reason string   `json:"reason"`
}

func decodeBody(q *request, v any) bool {
	dec := json.NewDecoder(q.r.Body)
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		q.fail(http.StatusBadRequest, "bad_request", "request body: "+err.Error())
		return false
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		q.fail(http.StatusBadRequest, "bad_request", "request body: one JSON object expected")
		return false
	}
	return true
}

func (s *Server) replay(q *request) {
	var body ReplayBody
	if !decodeBody(q, &body) {
		return
	}
	// The replay outlives a client that goes away: stopping halfway through
	// would leave the selection half replayed with no one to read the result.
	ctx := context.WithoutCancel(q.r.Context())
	res, err := s.Replayer.Replay(ctx, auditor.ReplayRequest{
		IDs: body.IDs, Canary: body.Canary, Rate: body.Rate, Reason: body.Reason,
		Actor: q.who.Name, Role: q.who.Role, CorrelationID: q.corr,
	})
	if err != nil {
		s.failErr(q, err)
		return
	}
	q.json(http.StatusOK, res)
}

func (s *Server) purge(q *request) {
	var body PurgeBody
	if !decodeBody(q, &body) {
		return
	}
	res, err := s.Purger.Purge(context.WithoutCancel(q.r.Context()), auditor.PurgeRequest{
		IDs: body.IDs, Reason: body.Reason, Actor: q.who.Name, Role: q.who.Role, CorrelationID: q.corr,
	})
	if err != nil {
		s.failErr(q, err)
		return
	}
	q.json(http.StatusOK, res)
}

func (s *Server) completeness(q *request) {
	to, ok := parseTime(q, "to", s.Now())
	if !ok {
		return
	}
	from, ok := parseTime(q, "from", to.Add(-time.Hour))
	if !ok {
		return
	}
	qs := q.r.URL.Query()
	rep, err := s.Checker.Check(q.r.Context(), qs.Get("topic"), qs.Get("group"), from, to)
	if err != nil {
		s.failErr(q, err)
		return
	}
	q.json(http.StatusOK, rep)
}
