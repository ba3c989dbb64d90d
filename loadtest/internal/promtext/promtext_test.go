package promtext

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"
)

const exposition = `# HELP x_total Things.
# TYPE x_total counter
x_total{reason="a"} 2
x_total{reason="b"} 3
x_total_other 100
h_bucket{le="0.05"} 7
h_bucket{le="0.1"} 9
up 1
`

// TestSumSelectsByNameOrSeries: a name sums its label sets and no metric
// whose name merely starts with it; a written-out series selects itself.
func TestSumSelectsByNameOrSeries(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path != "/metrics" {
			http.NotFound(w, r)
			return
		}
		_, _ = w.Write([]byte(exposition))
	}))
	t.Cleanup(srv.Close)
	e, err := Get(context.Background(), srv.URL+"/metrics")
	if err != nil {
		t.Fatal(err)
	}
	for _, tc := range []struct {
		name string
		want float64
		ok   bool
	}{
		{"x_total", 5, true},
		{`h_bucket{le="0.05"}`, 7, true},
		{"up", 1, true},
		{"missing", 0, false},
	} {
		if got, ok := e.Sum(tc.name); got != tc.want || ok != tc.ok {
			t.Errorf("Sum(%s) = %v, %v; want %v, %v", tc.name, got, ok, tc.want, tc.ok)
		}
	}
	if got := e.Series("x_total"); len(got) != 2 || got[0] != `{reason="a"} 2` {
		t.Errorf("Series(x_total) = %q", got)
	}
	if _, err := Get(context.Background(), srv.URL+"/nothing"); err == nil {
		t.Error("a 404 scrape is not an error")
	}
}
