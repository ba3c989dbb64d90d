package httpapi

import (
	"bytes"
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// DefaultMaxBody bounds a request body unless a server sets its own limit.
const DefaultMaxBody = 1 << 20

// LimitBody caps every request body at n bytes; reading past it fails with
// *http.MaxBytesError (DecodeJSON answers 413).
func LimitBody(n int64, next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Body != nil && r.Body != http.NoBody {
			r.Body = http.MaxBytesReader(w, r.Body, n)
		}
		next.ServeHTTP(w, r)
	})
}

// ReadBody reads the whole body; a body over the limit is a 413 problem.
func ReadBody(r *http.Request) ([]byte, error) {
	b, err := io.ReadAll(r.Body)
	var tooBig *http.MaxBytesError
	switch {
	case errors.As(err, &tooBig):
		return nil, Errorf(http.StatusRequestEntityTooLarge, ProblemTooLarge, "body over %d bytes", tooBig.Limit)
	case err != nil:
		return nil, BadRequest("read body: %v", err)
	}
	return b, nil
}

// DecodeJSON decodes the body as exactly one JSON object into v, refusing
// unknown fields. Errors are problems: 400 naming what is wrong, 413 over the
// body limit.
func DecodeJSON(r *http.Request, v any) error {
	b, err := ReadBody(r)
	if err != nil {
		return err
	}
	return DecodeStrict(b, v)
}

// DecodeStrict decodes b as exactly one JSON value into v, refusing unknown
// fields; errors are 400 problems.
func DecodeStrict(b []byte, v any) error {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.DisallowUnknownFields()
	if err := dec.Decode(v); err != nil {
		return BadRequest("request body: %v", err)
	}
	if _, err := dec.Token(); !errors.Is(err, io.EOF) {
		return BadRequest("request body: one JSON object expected")
	}
	return nil
}
