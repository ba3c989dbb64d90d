// Package quota reads a principal's daily usage from the quota service's usage
// API (GET /v1/usage/{kind}/{id}?days=N, docs/quota.md).
package quota

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"strings"
	"time"
)

// MaxDays is the longest window the usage API serves.
const MaxDays = 400

// Day is one UTC day's allowed units.
type Day struct {
	Day   string `json:"day"` // YYYY-MM-DD
	Units int64  `json:"units"`
}

// Report is the usage API's answer: days oldest first, ending today (UTC).
type Report struct {
	Principal string `json:"principal"`
	Today     int64  `json:"today"`
	Total     int64  `json:"total"`
	Days      []Day  `json:"days"`
}

// Client calls the usage API.
type Client struct {
	base string
	http *http.Client
}

// New returns a client for the usage API at base (e.g. http://127.0.0.1:8085).
func New(base string, hc *http.Client) (*Client, error) {
	u, err := url.Parse(base)
	if err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		return nil, fmt.Errorf("parse quota URL %q: want http(s)://host:port", base)
	}
	if hc == nil {
		hc = &http.Client{Timeout: 3 * time.Second}
	}
	return &Client{base: strings.TrimRight(base, "/"), http: hc}, nil
}

// Usage reads the last days days of kind:id's usage.
func (c *Client) Usage(ctx context.Context, kind, id string, days int) (Report, error) {
	if days < 1 || days > MaxDays {
		return Report{}, fmt.Errorf("read usage: days %d not in 1..%d", days, MaxDays)
	}
	u := c.base + "/v1/usage/" + url.PathEscape(kind) + "/" + url.PathEscape(id) + "?days=" + strconv.Itoa(days)
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return Report{}, fmt.Errorf("build usage request: %w", err)
	}
	res, err := c.http.Do(req)
	if err != nil {
		return Report{}, fmt.Errorf("read usage: %w", err)
	}
	defer res.Body.Close()
	body, err := io.ReadAll(io.LimitReader(res.Body, 1<<20))
	if err != nil {
		return Report{}, fmt.Errorf("read usage body: %w", err)
	}
	if res.StatusCode != http.StatusOK {
		var p struct {
			Detail string `json:"detail"`
		}
		_ = json.Unmarshal(body, &p)
		return Report{}, fmt.Errorf("read usage: quota service answered %d %s", res.StatusCode, p.Detail)
	}
	var rep Report
	if err := json.Unmarshal(body, &rep); err != nil {
		return Report{}, fmt.Errorf("decode usage: %w", err)
	}
	for _, d := range rep.Days {
		if _, err := time.Parse("2006-01-02", d.Day); err != nil {
			return Report{}, fmt.Errorf("decode usage: day %q: %w", d.Day, err)
		}
		if d.Units < 0 {
			return Report{}, errors.New("decode usage: negative units")
		}
	}
	return rep, nil
}
