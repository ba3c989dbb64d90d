package api

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"time"
	"unicode/utf8"

	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/auditor"
)

// Server serves the API. Every /v1 route needs a bearer token; viewer routes
// read, sre routes change (and are audited by the auditor package). Errors
// are RFC 9457 problems; the correlation id is X-Request-Id (pkg/httpapi).
type Server struct {
	Store    *auditor.Store
	Replayer *auditor.Replayer
	Purger   *auditor.Purger
	Checker  *auditor.Checker
	Tokens   *Tokens
	Now      func() time.Time
	Logger   *slog.Logger

	auth *httpapi.Auth
}

// NewServer returns the API.
func NewServer(s Server) *Server {
	if s.Logger == nil {
		s.Logger = slog.New(slog.DiscardHandler)
	}
	log := s.Logger
	s.auth = &httpapi.Auth{Tokens: s.Tokens.httpapi(), Roles: roles(), Realm: "floodgate-dlq", Now: s.Now,
		Audit: func(ctx context.Context, e httpapi.AuthEvent) {
			if e.Outcome != httpapi.AuthAllowed {
				log.WarnContext(ctx, "api request refused", "route", e.Route, "reason", string(e.Outcome),
					"actor", e.Caller.Name, "role", e.Caller.Role)
			}
		}}
	return &s
}

// Register adds the API's routes to mux.
func (s *Server) Register(mux *httpapi.Mux) {
	mux.Handle("GET /v1/records", s.route("list", RoleViewer, s.list))
	mux.Handle("GET /v1/records/{id}", s.route("inspect", RoleViewer, s.inspect))
	mux.Handle("POST /v1/replays", s.route("replay", RoleSRE, s.replay))
	mux.Handle("POST /v1/purges", s.route("purge", RoleSRE, s.purge))
	mux.Handle("GET /v1/completeness", s.route("completeness", RoleViewer, s.completeness))
}

type request struct {
	w       http.ResponseWriter
	r       *http.Request
	who     Principal
	corr    string
	written bool
}

func (q *request) json(status int, v any) {
	q.written = true
	httpapi.WriteJSON(q.w, status, v)
}

// fail answers a problem of type typ (an httpapi.Problem* constant).
func (q *request) fail(status int, typ, msg string) {
	q.written = true
	httpapi.WriteProblem(q.w, q.r, httpapi.Problem{Type: typ, Status: status, Detail: msg})
}

func (s *Server) route(name, role string, h func(*request)) http.Handler {
	return s.auth.Require(name, role, http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		who, _ := httpapi.CallerFrom(r.Context())
		q := &request{w: w, r: r, who: who, corr: httpapi.RequestID(r.Context())}
		h(q)
		if !q.written {
			q.fail(http.StatusInternalServerError, httpapi.ProblemInternal, "no response")
		}
	}))
}

// failErr maps an error to its response; unexpected errors are logged with
// the correlation id and answered without their detail.
func (s *Server) failErr(q *request, err error) {
	switch {
	case errors.Is(err, auditor.ErrBadRequest), errors.Is(err, auditor.ErrBadFilter), errors.Is(err, auditor.ErrBadID):
		q.fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, err.Error())
	case errors.Is(err, auditor.ErrNotFound):
		q.fail(http.StatusNotFound, httpapi.ProblemNotFound, err.Error())
	case errors.Is(err, auditor.ErrReplayRunning):
		q.fail(http.StatusConflict, httpapi.ProblemConflict, err.Error())
	default:
		s.Logger.ErrorContext(q.r.Context(), "api request failed", "err", err)
		q.fail(http.StatusInternalServerError, httpapi.ProblemInternal, "internal error; quote the correlation id to an operator")
	}
}

func parseTime(q *request, name string, def time.Time) (time.Time, bool) {
	v := q.r.URL.Query().Get(name)
	if v == "" {
		return def, true
	}
	t, err := time.Parse(time.RFC3339Nano, v)
	if err != nil {
		q.fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, name+"="+strconv.Quote(v)+": want an RFC 3339 time such as 2026-01-02T15:04:05Z")
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
			q.fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, "limit="+strconv.Quote(v)+": want an integer in 1..1000")
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
	q.json(http.StatusOK, page)
}

// Inspection is GET /v1/records/{id}'s answer (pkg/dlqapi).
type Inspection = dlqapi.Inspection

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
	q.json(http.StatusOK, out)
}

// ReplayBody and PurgeBody are the bodies of POST /v1/replays and
// /v1/purges (pkg/dlqapi).
type (
	ReplayBody = dlqapi.ReplayBody
	PurgeBody  = dlqapi.PurgeBody
)

func decodeBody(q *request, v any) bool {
	if err := httpapi.DecodeJSON(q.r, v); err != nil {
		var pe *httpapi.Error
		if errors.As(err, &pe) {
			q.written = true
			httpapi.WriteProblem(q.w, q.r, pe.Problem)
			return false
		}
		q.fail(http.StatusBadRequest, httpapi.ProblemInvalidRequest, err.Error())
		return false
	}
	return true
}

// noWriteDeadline lifts the server's write timeout for an answer that waits
// on a replay or purge (a canary is watched up to FLOODGATE_DLQ_CANARY_TIMEOUT,
// a replay runs at the replay rate).
func noWriteDeadline(q *request) {
	_ = http.NewResponseController(q.w).SetWriteDeadline(time.Time{})
}

func (s *Server) replay(q *request) {
	var body ReplayBody
	if !decodeBody(q, &body) {
		return
	}
	noWriteDeadline(q)
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
	noWriteDeadline(q)
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
