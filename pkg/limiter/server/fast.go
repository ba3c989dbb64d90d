package server

import (
	"context"
	"net"
	"net/http"

	"github.com/valyala/fasthttp"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/checkapi"
)

// FastRoutes are the check API's hot path for a fasthttp server
// (httpapi.ServerConfig.NewFastServer): POST /v1/check, answered as
// handleCheck answers it — the same problems, headers, deadline, caller
// checks and decision — without net/http's per-request machinery. Every
// other request (the batch form, 404s, 405s) is Handler's, through the
// server's adaptor.
func (s *Server) FastRoutes() []httpapi.FastRoute {
	return []httpapi.FastRoute{{Method: http.MethodPost, Path: "/v1/check", Handler: s.fastCheck}}
}

// fastCheck is handleCheck on fasthttp. The check's context carries its
// correlation id and is never cancelled: fasthttp does not watch the
// connection while a handler runs (callerGone's peek still drops a check
// whose caller left before it was read).
func (s *Server) fastCheck(ctx *fasthttp.RequestCtx, id string) {
	did := NewDecisionID()
	h := &ctx.Request.Header
	var cl callers.Caller
	if s.callers != nil {
		var err error
		if cl, err = s.authorize(string(h.Peek("Authorization"))); err != nil {
			ctx.Response.Header.Set("WWW-Authenticate", authChallenge)
			fastProblem(ctx, id, http.StatusUnauthorized, httpapi.ProblemUnauthenticated, err.Error())
			return
		}
	}
	// ctx.Time is when fasthttp called the handler: no clock read of our own
	// (a clock read was 4-5 % of the pinned peerbench's CPU, issue 34).
	deadline, err := s.headerDeadline(ctx.Time(), string(h.Peek(HeaderTimeout)), string(h.Peek(HeaderEnvoyTimeout)))
	if err != nil {
		fastProblem(ctx, id, http.StatusBadRequest, httpapi.ProblemInvalidRequest, err.Error())
		return
	}
	if s.fastCallerGone(ctx) {
		return
	}
	body := ctx.PostBody()
	var req checkapi.CheckRequest
	if err := decodeBytes(body[:min(len(body), maxCheckBody)], nil, &req); err != nil {
		fastProblem(ctx, id, http.StatusBadRequest, httpapi.ProblemInvalidRequest, "body: "+err.Error())
		return
	}
	if status, typ, err := s.vet(cl, &req); err != nil {
		fastProblem(ctx, id, status, typ, err.Error())
		return
	}
	res := s.DecideCall(httpapi.WithRequestID(context.Background(), id), did, &req, Call{Protocol: ProtocolHTTP, Deadline: deadline})
	bp := respBufs.Get().(*[]byte)
	out := appendCheckResponse((*bp)[:0], did, id, res)
	ctx.Response.Header.SetContentType("application/json")
	ctx.SetStatusCode(http.StatusOK)
	ctx.SetBody(out) // copied
	*bp = out
	respBufs.Put(bp)
}

// fastProblem is problem on fasthttp (the X-Request-Id is set already).
func fastProblem(ctx *fasthttp.RequestCtx, id string, status int, typ, detail string) {
	httpapi.WriteFastProblem(ctx, httpapi.Problem{Type: typ, Status: status, Detail: detail, CorrelationID: id})
}

// fastCallerGone is callerGone on fasthttp: the connection is closed with
// no answer.
func (s *Server) fastCallerGone(ctx *fasthttp.RequestCtx) bool {
	now := ctx.Time()
	if !s.gone.peek(now) || !httpapi.CallerGoneConn(ctx.Conn()) {
		return false
	}
	s.gone.found(now)
	s.CountPastDeadline(ProtocolHTTP, "")
	ctx.HijackSetNoResponse(true)
	ctx.Hijack(func(c net.Conn) { _ = c.Close() })
	return true
}
