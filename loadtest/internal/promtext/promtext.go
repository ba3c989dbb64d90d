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

// Get scrapes url.
func Get(ctx context.Context, url string) (Exposition, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return nil, err
	}
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
