package limitertest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"mime"
	"net/http"

	rlsv3 "github.com/envoyproxy/go-control-plane/envoy/service/ratelimit/v3"
	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/status"
	"google.golang.org/protobuf/encoding/protojson"
)

// JSONClient calls ShouldRateLimit over envoy ratelimit's POST /json (served
// by envoy ratelimit and by Floodgate's check API) as an HTTP client of it
// does: the request in protojson, the answer read back from protojson when
// it is one — 200 for OK, 429 for OVER_LIMIT, 500 for UNKNOWN; a status that
// does not agree with the answer's code is an error. Any other answer is an
// error with the gRPC code of its status (400 InvalidArgument, 401
// Unauthenticated, 403 PermissionDenied, 413 ResourceExhausted, 503
// Unavailable, else Unknown) and its body as the message.
type JSONClient struct {
	URL    string      // the service's base URL, e.g. http://127.0.0.1:8080
	Header http.Header // sent with every call (Authorization, deadline headers)
}

var jsonStatus = map[rlsv3.RateLimitResponse_Code]int{
	rlsv3.RateLimitResponse_OK: http.StatusOK, rlsv3.RateLimitResponse_OVER_LIMIT: http.StatusTooManyRequests,
	rlsv3.RateLimitResponse_UNKNOWN: http.StatusInternalServerError,
}

var jsonRefusal = map[int]codes.Code{
	http.StatusBadRequest: codes.InvalidArgument, http.StatusUnauthorized: codes.Unauthenticated,
	http.StatusForbidden: codes.PermissionDenied, http.StatusRequestEntityTooLarge: codes.ResourceExhausted,
	http.StatusServiceUnavailable: codes.Unavailable,
}

// ShouldRateLimit is one POST /json.
func (c JSONClient) ShouldRateLimit(ctx context.Context, in *rlsv3.RateLimitRequest, _ ...grpc.CallOption) (*rlsv3.RateLimitResponse, error) {
	body, err := protojson.Marshal(in)
	if err != nil {
		return nil, err
	}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, c.URL+"/json", bytes.NewReader(body))
	if err != nil {
		return nil, err
	}
	for k, v := range c.Header {
		req.Header[k] = v
	}
	req.Header.Set("Content-Type", "application/json")
	res, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, err
	}
	defer res.Body.Close()
	b, err := io.ReadAll(res.Body)
	if err != nil {
		return nil, err
	}
	if ct, _, _ := mime.ParseMediaType(res.Header.Get("Content-Type")); ct == "application/json" {
		var out rlsv3.RateLimitResponse
		if err := protojson.Unmarshal(b, &out); err != nil {
			return nil, fmt.Errorf("/json answered %d with %q: %w", res.StatusCode, b, err)
		}
		if want := jsonStatus[out.GetOverallCode()]; want != res.StatusCode {
			return nil, fmt.Errorf("/json answered %s with %d, want %d", out.GetOverallCode(), res.StatusCode, want)
		}
		return &out, nil
	}
	code, ok := jsonRefusal[res.StatusCode]
	if !ok {
		code = codes.Unknown
	}
	return nil, status.Errorf(code, "/json answered %d: %s", res.StatusCode, b)
}
