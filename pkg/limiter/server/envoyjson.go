package server

// envoy ratelimit's two HTTP endpoints, on the check API, so that a fleet
// moving from it keeps its HTTP clients and its probes (docs/envoy.md):
// POST /json, its rate-limit call for clients that cannot speak gRPC, and
// GET /healthcheck, its probe.

import (
	"context"
	"encoding/json"
	"errors"
	"io"
	"net/http"
	"strconv"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
)

// maxEnvoyJSONBody bounds a /json request, as the gRPC transports bound a
// call's message (1 MiB).
const maxEnvoyJSONBody = 1 << 20

// ServeEnvoyJSON answers POST /json of Handler with rls, the service the
// gRPC transports serve (envoyrls.EnvoyRLS). Set it before serving; unset,
// /json answers 404.
func (s *Server) ServeEnvoyJSON(rls rlsv3.RateLimitServiceServer) { s.envoyJSON = rls }

// handleEnvoyJSON is envoy ratelimit's /json: a RateLimitRequest in
// protojson, decided as the gRPC call is, its RateLimitResponse in protojson
// with 200 (OK), 429 (OVER_LIMIT) or 500 (UNKNOWN), as envoy ratelimit
// answers it. Beyond it, as on /v1/check: the caller authenticates when
// callers are configured (and may name only its principals), the deadline
// headers apply, the body is bounded, and a refusal is a problem with a
// correlation id whose status says why (envoy ratelimit answers every
// failure 400 with a text body).
func (s *Server) handleEnvoyJSON(w http.ResponseWriter, r *http.Request) {
	id := requestID(r)
	if s.envoyJSON == nil {
		s.problem(w, id, http.StatusNotFound, httpapi.ProblemNotFound, "envoy ratelimit's /json is not served by this limiter")
		return
	}
	cl, ok := s.authenticate(w, r, id)
	if !ok {
		return
	}
	deadline, err := s.httpDeadline(r)
	if err != nil {
		s.problem(w, id, http.StatusBadRequest, httpapi.ProblemInvalidRequest, err.Error())
		return
	}
	body, err := io.ReadAll(http.MaxBytesReader(w, r.Body, maxEnvoyJSONBody))
	if err != nil {
		if over := new(http.MaxBytesError); errors.As(err, &over) {
			s.problem(w, id, http.StatusRequestEntityTooLarge, httpapi.ProblemTooLarge, "body: over "+strconv.Itoa(maxEnvoyJSONBody)+" bytes")
			return
		}
		s.problem(w, id, http.StatusBadRequest, httpapi.ProblemInvalidRequest, "body: "+err.Error())
		return
	}
	var req rlsv3.RateLimitRequest
	if err := protojson.Unmarshal(body, &req); err != nil {
		s.problem(w, id, http.StatusBadRequest, httpapi.ProblemInvalidRequest, "body: not a RateLimitRequest: "+err.Error())
		return
	}
	ctx := r.Context()
	if s.callers != nil {
		ctx = callers.NewContext(ctx, cl)
	}
	if !deadline.IsZero() {
		var cancel context.CancelFunc
		ctx, cancel = context.WithDeadline(ctx, deadline)
		defer cancel()
	}
	resp, err := s.envoyJSON.ShouldRateLimit(ctx, &req)
	if err != nil {
		st, typ := envoyJSONRefusal(status.Code(err))
		s.problem(w, id, st, typ, status.Convert(err).Message())
		return
	}
	out, err := protojson.Marshal(resp)
	if err != nil {
		s.log.Error("envoy /json: encode the answer", "err", err, "request_id", id)
		s.problem(w, id, http.StatusInternalServerError, httpapi.ProblemInternal, "the answer could not be encoded")
		return
	}
	code := http.StatusOK
	switch resp.GetOverallCode() {
	case rlsv3.RateLimitResponse_OVER_LIMIT:
		code = http.StatusTooManyRequests
	case rlsv3.RateLimitResponse_UNKNOWN:
		code = http.StatusInternalServerError
	}
	h := w.Header()
	h.Set(httpapi.HeaderRequestID, id)
	h.Set("Content-Type", "application/json")
	h.Set("Content-Length", strconv.Itoa(len(out)))
	w.WriteHeader(code)
	if _, err := w.Write(out); err != nil {
		s.log.Debug("write response", "err", err)
	}
}

// envoyJSONRefusal is the status and problem type of a /json call the
// service refused with code.
func envoyJSONRefusal(code codes.Code) (int, string) {
	switch code {
	case codes.InvalidArgument:
		return http.StatusBadRequest, httpapi.ProblemInvalidRequest
	case codes.Unauthenticated:
		return http.StatusUnauthorized, httpapi.ProblemUnauthenticated
	case codes.PermissionDenied:
		return http.StatusForbidden, httpapi.ProblemForbidden
	case codes.DeadlineExceeded, codes.ResourceExhausted:
		// Its deadline passed before it was decided, or the entry gate
		// shed it: the limiter is over capacity.
		return http.StatusServiceUnavailable, httpapi.ProblemReducedCapacity
	case codes.Unavailable:
		return http.StatusServiceUnavailable, httpapi.ProblemUnavailable // Redis, with no fail policy
	}
	return http.StatusInternalServerError, httpapi.ProblemInternal
}

// handleHealthcheck is envoy ratelimit's probe: 200 "OK" while the limiter
// is ready, else 500 with /readyz's body, which says what is not.
func (s *Server) handleHealthcheck(w http.ResponseWriter, _ *http.Request) {
	ok, r := s.Readiness()
	if !ok {
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(http.StatusInternalServerError)
		_ = json.NewEncoder(w).Encode(r)
		return
	}
	w.Header().Set("Content-Type", "text/plain; charset=utf-8")
	_, _ = io.WriteString(w, "OK")
}
