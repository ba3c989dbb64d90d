package httpapi

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/http/httptest"
	"strings"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/require"
)

// decodeProblemBody requires a problem+json answer and decodes it.
func decodeProblemBody(t *testing.T, res *http.Response) Problem {
	t.Helper()
	require.Equal(t, ContentTypeProblem, res.Header.Get("Content-Type"))
	var p Problem
	require.NoError(t, json.NewDecoder(res.Body).Decode(&p))
	return p
}

func TestProblemsCarryTheCorrelationID(t *testing.T) {
	var logs bytes.Buffer
	log := slog.New(LogHandler{slog.NewJSONHandler(&logs, nil)})
	mux := http.NewServeMux()
	mux.Handle("GET /refused", Handle(log, func(w http.ResponseWriter, r *http.Request) error {
		e := Errorf(http.StatusPreconditionFailed, ProblemPreconditionFailed, "settings are at version %d", 7)
		e.Header = http.Header{"Etag": {`"7"`}}
		return e
	}))
	mux.Handle("GET /broken", Handle(log, func(w http.ResponseWriter, r *http.Request) error {
		return errors.New("dynamodb: secret table name")
	}))
	srv := httptest.NewServer(Middleware(Options{Log: log, AccessLog: true}, mux))
	defer srv.Close()

	req, _ := http.NewRequest(http.MethodGet, srv.URL+"/refused", nil)
	req.Header.Set(HeaderRequestID, "trace-1.a_b")
	res, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res.Body.Close()
	require.Equal(t, http.StatusPreconditionFailed, res.StatusCode)
	require.Equal(t, "trace-1.a_b", res.Header.Get(HeaderRequestID))
	require.Equal(t, `"7"`, res.Header.Get("ETag"))
	p := decodeProblemBody(t, res)
	require.Equal(t, Problem{Type: ProblemPreconditionFailed, Title: "Precondition Failed", Status: 412,
		Detail: "settings are at version 7", CorrelationID: "trace-1.a_b"}, p)
	require.Equal(t, "precondition-failed", p.Code())

	// A malformed id is replaced; an unexpected error is a 500 that leaks nothing.
	req, _ = http.NewRequest(http.MethodGet, srv.URL+"/broken", nil)
	req.Header.Set(HeaderRequestID, "bad id with spaces")
	res2, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer res2.Body.Close()
	id := res2.Header.Get(HeaderRequestID)
	require.NotEqual(t, "bad id with spaces", id)
	require.True(t, ValidRequestID(id))
	p = decodeProblemBody(t, res2)
	require.Equal(t, 500, p.Status)
	require.Equal(t, ProblemInternal, p.Type)
	require.Equal(t, id, p.CorrelationID)
	require.NotContains(t, p.Detail, "secret")
	require.Contains(t, logs.String(), `"correlation_id":"`+id+`"`)
	require.Contains(t, logs.String(), "secret table name", "the error itself is logged")
}

func TestValidRequestID(t *testing.T) {
	for id, ok := range map[string]bool{"abc": true, "a.b_c-D9": true, "": false, strings.Repeat("a", 64): true,
		strings.Repeat("a", 65): false, "a b": false, "a\nb": false, "ü": false, "a/b": false} {
		require.Equal(t, ok, ValidRequestID(id), "%q", id)
	}
}

func TestAuthTokensAndRoles(t *testing.T) {
	roles := Roles{"viewer", "sre"}
	viewerTok, sreTok := "fgt_viewer-token", "fgt_sre-token"
	toks, err := ParseTokenSpec(roles, "dash:viewer:"+HashToken(viewerTok)+", alice:sre:"+strings.ToUpper(HashToken(sreTok)))
	require.NoError(t, err)
	require.Equal(t, 2, toks.Len())
	fileToks, err := ParseTokenSpec(roles, "# comment\n\n"+TokenSpecEntry("dash", "viewer", viewerTok)+"\n  "+TokenSpecEntry("alice", "sre", sreTok)+"\n")
	require.NoError(t, err)
	require.Equal(t, toks, fileToks, "one entry a line (a file) or comma-separated (a variable): the same tokens")
	legacy, err := ParseLegacyTokenFile(roles, strings.NewReader("# comment\n\ndash viewer "+HashToken(viewerTok)+"\nalice sre "+HashToken(sreTok)+"\n"))
	require.NoError(t, err)
	require.Equal(t, toks, legacy, "the former file form still reads the same tokens")

	for _, tc := range []struct{ spec, want string }{
		{"x:viewer:abc", "entry 1 (x): hash must be 64 hex digits"},
		{"x:viewer:" + HashToken("a") + "\n# c\ny:sre:abc", "entry 2 (y): hash must be 64 hex digits"},
		{"x:viewer:" + HashToken("a") + ":more", "entry 1: want name:role:sha256hex"},
		{"x:admin:" + HashToken("a"), `role "admin" is not one of viewer|sre`},
		{"x:viewer:" + HashToken("a") + ",x:sre:" + HashToken("b"), `name "x" appears twice`},
		{"x:viewer:" + HashToken("a") + ",y:sre:" + HashToken("a"), "the same token is listed twice"},
		{"nope", "want name:role:sha256hex"},
	} {
		_, err := ParseTokenSpec(roles, tc.spec)
		require.ErrorContains(t, err, tc.want, tc.spec)
	}
	_, err = ParseLegacyTokenFile(roles, strings.NewReader("a viewer "+HashToken("a")+"\nb root "+HashToken("b")))
	require.ErrorContains(t, err, "tokens line 2")

	var audit []AuthEvent
	a := &Auth{Tokens: toks, Roles: roles, Realm: "floodgate-test", Audit: func(_ context.Context, e AuthEvent) { audit = append(audit, e) }}
	mux := http.NewServeMux()
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		c, _ := CallerFrom(r.Context())
		_, _ = w.Write([]byte(c.Name + "/" + c.Role))
	})
	mux.Handle("GET /read", a.Require("read", "viewer", ok))
	mux.Handle("POST /change", a.Require("change", "sre", ok))
	srv := httptest.NewServer(Middleware(Options{}, mux))
	defer srv.Close()
	call := func(method, path, token string) (*http.Response, string) {
		req, _ := http.NewRequest(method, srv.URL+path, nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		res, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		defer res.Body.Close()
		var buf bytes.Buffer
		_, _ = buf.ReadFrom(res.Body)
		return res, buf.String()
	}
	res, _ := call("GET", "/read", "")
	require.Equal(t, 401, res.StatusCode)
	require.Equal(t, `Bearer realm="floodgate-test"`, res.Header.Get("WWW-Authenticate"))
	res, _ = call("GET", "/read", "fgt_wrong")
	require.Equal(t, 401, res.StatusCode)
	res, body := call("GET", "/read", viewerTok)
	require.Equal(t, 200, res.StatusCode)
	require.Equal(t, "dash/viewer", body)
	res, body = call("POST", "/change", viewerTok)
	require.Equal(t, 403, res.StatusCode)
	require.Contains(t, body, "role viewer may not change; it needs role sre")
	res, body = call("POST", "/change", sreTok)
	require.Equal(t, 200, res.StatusCode)
	require.Equal(t, "alice/sre", body)
	res, _ = call("GET", "/read", sreTok) // sre may do what a viewer may
	require.Equal(t, 200, res.StatusCode)

	var outcomes []string
	for _, e := range audit {
		outcomes = append(outcomes, string(e.Outcome)+":"+e.Route+":"+e.Caller.Name)
		require.True(t, ValidRequestID(e.RequestID))
	}
	require.Equal(t, []string{"unauthenticated:read:", "unauthenticated:read:", "allowed:read:dash", "forbidden:change:dash",
		"allowed:change:alice", "allowed:read:alice"}, outcomes)
}

func TestBodyLimitAndStrictDecode(t *testing.T) {
	mux := http.NewServeMux()
	mux.Handle("POST /x", Handle(nil, func(w http.ResponseWriter, r *http.Request) error {
		var v struct {
			A int `json:"a"`
		}
		if err := DecodeJSON(r, &v); err != nil {
			return err
		}
		WriteJSON(w, http.StatusOK, v)
		return nil
	}))
	srv := httptest.NewServer(Middleware(Options{MaxBody: 64}, mux))
	defer srv.Close()
	for _, tc := range []struct {
		body   string
		status int
		detail string
	}{
		{`{"a":1}`, 200, ""},
		{`{"a":1,"b":2}`, 400, `unknown field "b"`},
		{`{"a":1}{"a":2}`, 400, "one JSON object expected"},
		{`{"a":` + strings.Repeat("1", 100) + `}`, 413, "body over 64 bytes"},
	} {
		res, err := http.Post(srv.URL+"/x", "application/json", strings.NewReader(tc.body))
		require.NoError(t, err)
		require.Equal(t, tc.status, res.StatusCode, tc.body)
		if tc.status != 200 {
			require.Contains(t, decodeProblemBody(t, res).Detail, tc.detail)
		}
		res.Body.Close()
	}
}

func TestMiddlewareMetricsUseTheMatchedRoute(t *testing.T) {
	reg := prometheus.NewRegistry()
	m := NewMetrics(reg, "floodgate_test_api")
	mux := http.NewServeMux()
	mux.HandleFunc("GET /v1/records/{id}", func(w http.ResponseWriter, r *http.Request) { w.WriteHeader(http.StatusNotFound) })
	srv := httptest.NewServer(Middleware(Options{Metrics: m}, mux))
	defer srv.Close()
	for _, p := range []string{"/v1/records/a", "/v1/records/b", "/elsewhere"} {
		res, err := http.Get(srv.URL + p)
		require.NoError(t, err)
		res.Body.Close()
	}
	require.Equal(t, 2.0, counterValue(t, m.requests.WithLabelValues("GET /v1/records/{id}", "404")))
	require.Equal(t, 1.0, counterValue(t, m.requests.WithLabelValues("unmatched", "404")))
}

func TestClientSendsTheRequestIDAndReadsProblems(t *testing.T) {
	var gotID, gotAuth string
	mux := http.NewServeMux()
	mux.Handle("POST /ok", Handle(nil, func(w http.ResponseWriter, r *http.Request) error {
		gotID, gotAuth = r.Header.Get(HeaderRequestID), r.Header.Get("Authorization")
		var in map[string]int
		if err := DecodeJSON(r, &in); err != nil {
			return err
		}
		WriteJSON(w, http.StatusOK, map[string]int{"twice": 2 * in["n"]})
		return nil
	}))
	mux.Handle("GET /missing", Handle(nil, func(w http.ResponseWriter, r *http.Request) error {
		return Errorf(http.StatusNotFound, ProblemNotFound, "no record %q", "x")
	}))
	mux.Handle("GET /down", Handle(nil, func(w http.ResponseWriter, r *http.Request) error {
		return Errorf(http.StatusServiceUnavailable, ProblemUnavailable, "store down")
	}))
	srv := httptest.NewServer(Middleware(Options{}, mux))
	defer srv.Close()

	c, err := NewClient(ClientConfig{Name: "svc", BaseURL: srv.URL + "/", Token: "tok"})
	require.NoError(t, err)
	ctx := WithRequestID(context.Background(), "from-console-1")
	var out map[string]int
	_, err = c.Do(ctx, Call{Method: http.MethodPost, Path: "/ok", Body: map[string]int{"n": 21}, Out: &out})
	require.NoError(t, err)
	require.Equal(t, 42, out["twice"])
	require.Equal(t, "from-console-1", gotID)
	require.Equal(t, "Bearer tok", gotAuth)

	_, err = c.Do(ctx, Call{Method: http.MethodGet, Path: "/missing"})
	var pe *Error
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 404, pe.Status)
	require.Equal(t, "not-found", pe.Code())
	require.Equal(t, `no record "x"`, pe.Detail)
	require.Equal(t, "from-console-1", pe.CorrelationID)
	require.NotErrorIs(t, err, ErrUnavailable)

	_, err = c.Do(ctx, Call{Method: http.MethodGet, Path: "/down"})
	require.ErrorIs(t, err, ErrUnavailable)
	require.ErrorAs(t, err, &pe)
	require.Equal(t, 503, pe.Status)

	_, err = NewClient(ClientConfig{Name: "svc", BaseURL: "ftp://x"})
	require.ErrorContains(t, err, "svc URL")
}

func counterValue(t *testing.T, c prometheus.Counter) float64 {
	t.Helper()
	var m dto.Metric
	require.NoError(t, c.Write(&m))
	return m.GetCounter().GetValue()
}

func TestTokenEntriesWithFieldsOfTheirOwn(t *testing.T) {
	roles := Roles{"gateway"}
	entries, err := ParseTokenEntries(roles, "edge:gateway:"+HashToken("a")+":10:user,\npartner:gateway:"+HashToken("b"), 2)
	require.NoError(t, err)
	require.Len(t, entries, 2)
	require.Equal(t, []string{"10", "user"}, entries[0].Extra)
	require.Empty(t, entries[1].Extra)
	_, err = ParseTokenEntries(roles, "edge:gateway:"+HashToken("a")+":1:2:3", 2)
	require.ErrorContains(t, err, "entry 1: want name:role:sha256hex and up to 2 fields of its own")
}
