package promtext

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/stretchr/testify/require"
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

// TestAboveCountsTheTailBetweenTwoScrapes: the observations past a bound
// between two scrapes, and the bucket that holds the longest of them.
func TestAboveCountsTheTailBetweenTwoScrapes(t *testing.T) {
	t.Parallel()
	scrape := func(counts ...string) []Bucket {
		les := []string{"0.001", "0.004", "0.016", "0.064", "+Inf"}
		var e Exposition
		for i, c := range counts {
			e = append(e, `s_bucket{le="`+les[i]+`"} `+c, `s_bucket{le="`+les[i]+`",other="x"} 1`)
		}
		return e.Buckets("s")
	}
	from := scrape("10", "12", "13", "13", "13")
	to := scrape("100", "110", "118", "119", "119")
	if len(to) != 5 || to[4].Count != 120 {
		t.Fatalf("buckets summed over labels: %+v", to)
	}
	n, bound, most := Above(from, to, 0.003)
	if n != 8 || bound != 0.004 || most != 0.064 {
		t.Errorf("Above = %v past %v, longest ≤ %v; want 8 past 0.004, longest ≤ 0.064", n, bound, most)
	}
	if n, _, most := Above(from, from, 0.003); n != 0 || most != 0 {
		t.Errorf("no observations: %v, %v", n, most)
	}
}

// TestScrapesUncompressed: a service's own exposition handler (promhttp)
// is asked for no compression, so the scrape costs it no gzip.
func TestScrapesUncompressed(t *testing.T) {
	reg := prometheus.NewRegistry()
	c := prometheus.NewCounter(prometheus.CounterOpts{Name: "calls_total", Help: "calls"})
	reg.MustRegister(c)
	c.Add(3)
	var encodings []string
	h := promhttp.HandlerFor(reg, promhttp.HandlerOpts{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		rec := httptest.NewRecorder()
		h.ServeHTTP(rec, r)
		encodings = append(encodings, rec.Header().Get("Content-Encoding"))
		for k, v := range rec.Header() {
			w.Header()[k] = v
		}
		w.WriteHeader(rec.Code)
		_, _ = w.Write(rec.Body.Bytes())
	}))
	defer srv.Close()
	e, err := Get(context.Background(), srv.URL)
	require.NoError(t, err)
	v, ok := e.Sum("calls_total")
	require.True(t, ok)
	require.InDelta(t, 3.0, v, 0)
	require.Equal(t, []string{""}, encodings, "the handler did not compress")
}
