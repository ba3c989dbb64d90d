// Package promtext reads a service's Prometheus /metrics for the load and
// fault tools (chaos, peerbench): one scrape, then sums by metric name.
package promtext

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"strconv"
	"strings"
)

// Exposition is the lines of one scrape of a Prometheus text exposition.
type Exposition []string

// Get scrapes url, uncompressed: the tools scrape a service they measure,
// often twice a second, over loopback, and gzip cost the limiter 3.5 % of
// its CPU under overload (docs/chaos.md, "a generator that does not
// stall"); Go's client would otherwise ask for gzip.
func Get(ctx context.Context, url string) (Exposition, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
	req.Header.Set("Accept-Encoding", "identity")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("scrape %s: %s", url, resp.Status)
	}
	b, err := io.ReadAll(io.LimitReader(resp.Body, 16<<20))
	if err != nil {
		return nil, fmt.Errorf("scrape %s: %w", url, err)
	}
	return strings.Split(string(b), "\n"), nil
}

// Sum adds the samples of every series that name selects: a metric name
// (each of its label sets), or a name with its labels written out as the
// exposition writes them (`x_bucket{le="0.05"}`). ok is false when none does.
func (e Exposition) Sum(name string) (sum float64, ok bool) {
	for _, line := range e {
		if !strings.HasPrefix(line, name) || len(line) > len(name) && line[len(name)] != ' ' && line[len(name)] != '{' {
			continue
		}
		if v, err := strconv.ParseFloat(line[strings.LastIndexByte(line, ' ')+1:], 64); err == nil {
			sum, ok = sum+v, true
		}
	}
	return sum, ok
}

// Series returns the label sets and values of metric name's series, as
// written (`{reason="kafka"} 3`).
func (e Exposition) Series(name string) []string {
	var out []string
	for _, line := range e {
		if strings.HasPrefix(line, name+"{") {
			out = append(out, strings.TrimPrefix(line, name))
		}
	}
	return out
}

// Bucket is one cumulative histogram bucket: Count observations ≤ LE.
type Bucket struct {
	LE    float64
	Count float64
}

// Buckets returns histogram name's buckets (summed over its other labels),
// by le as the exposition lists them (ascending, +Inf last).
func (e Exposition) Buckets(name string) []Bucket {
	var out []Bucket
	at := map[float64]int{}
	for _, s := range e.Series(name + "_bucket") {
		i := strings.Index(s, `le="`)
		if i < 0 {
			continue
		}
		rest := s[i+4:]
		le, err := strconv.ParseFloat(rest[:strings.IndexByte(rest, '"')], 64)
		if err != nil {
			continue
		}
		v, err := strconv.ParseFloat(s[strings.LastIndexByte(s, ' ')+1:], 64)
		if err != nil {
			continue
		}
		if j, ok := at[le]; ok {
			out[j].Count += v
			continue
		}
		at[le] = len(out)
		out = append(out, Bucket{LE: le, Count: v})
	}
	return out
}

// Above is how many observations between from and to (two scrapes of the
// same histogram) exceeded the first bound at or over limit, that bound,
// and the bound below which every one of them fell (+Inf when some fell in
// the last bucket; 0 when none exceeded it).
func Above(from, to []Bucket, limit float64) (n, bound, most float64) {
	if len(from) != len(to) || len(to) == 0 {
		return 0, 0, 0
	}
	total := to[len(to)-1].Count - from[len(from)-1].Count
	for i := range to {
		if to[i].LE >= limit {
			n, bound = total-(to[i].Count-from[i].Count), to[i].LE
			break
		}
	}
	for i := range to {
		if to[i].Count-from[i].Count >= total {
			if n > 0 {
				most = to[i].LE
			}
			break
		}
	}
	return n, bound, most
}
