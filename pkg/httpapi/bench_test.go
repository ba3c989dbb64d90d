package httpapi

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
)

// BenchmarkMiddleware is what the API layer adds to one request, in
// process (no network): the limiter's check path runs with it.
//
//	go test -run '^$' -bench Middleware -benchmem ./pkg/httpapi/
func BenchmarkMiddleware(b *testing.B) {
	mux := http.NewServeMux()
	mux.HandleFunc("POST /v1/check", func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"allowed":true}`))
	})
	for _, bc := range []struct {
		name string
		h    http.Handler
	}{
		{"bare", mux},
		{"middleware", Middleware(Options{}, mux)},
		{"middleware+metrics", Middleware(Options{Metrics: NewMetrics(prometheus.NewRegistry(), "floodgate_bench")}, mux)},
	} {
		b.Run(bc.name, func(b *testing.B) {
			req := httptest.NewRequest(http.MethodPost, "/v1/check", http.NoBody)
			req.Header.Set(HeaderRequestID, "bench-1")
			b.ReportAllocs()
			for b.Loop() {
				w := httptest.NewRecorder()
				bc.h.ServeHTTP(w, req)
			}
		})
	}
}
