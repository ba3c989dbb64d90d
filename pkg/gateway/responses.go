package gateway

import "net/http"

// ResponseCounter counts the responses a gateway sent, by status. Count must be
// safe for concurrent use and must not block. pkg/gateway/influxresponses
// writes the counts to InfluxDB for the adjuster's error-rate signal; it is a
// package of its own so that a gateway that imports this one does not link the
// InfluxDB client.
type ResponseCounter interface {
	Count(status int)
}

// statusRecorder remembers the status a handler wrote.
type statusRecorder struct {
	http.ResponseWriter
	status int
}

func (s *statusRecorder) WriteHeader(code int) {
	if s.status == 0 {
		s.status = code
	}
	s.ResponseWriter.WriteHeader(code)
}

func (s *statusRecorder) Write(b []byte) (int, error) {
	if s.status == 0 {
		s.status = http.StatusOK
	}
	return s.ResponseWriter.Write(b)
}

// Unwrap lets http.ResponseController reach the underlying writer (Flush, Hijack).
func (s *statusRecorder) Unwrap() http.ResponseWriter { return s.ResponseWriter }
