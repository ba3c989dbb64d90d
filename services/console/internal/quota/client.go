// Package quota reads a principal's daily usage from the quota service's usage
// API (GET /v1/usage/{kind}/{id}?days=N, docs/quota.md).
package quota

import (
	"context"
	"errors"
	"fmt"
	"net/http"
	"net/url"
	"strconv"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/httpapi"
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

// Client calls the usage API (pkg/httpapi's client: the caller's
// X-Request-Id goes along).
type Client struct{ api *httpapi.Client }

// New returns a client for the usage API at base (e.g. http://127.0.0.1:8085).
func New(base, token string, hc *http.Client) (*Client, error) {
	c, err := httpapi.NewClient(httpapi.ClientConfig{Name: "quota", BaseURL: base, Token: token, HTTP: hc, Timeout: 3 * time.Second, MaxBody: 1 << 20})
	if err != nil {
		return nil, err
	}
	return &Client{api: c}, nil
}

// Usage reads the last days days of kind:id's usage.
func (c *Client) Usage(ctx context.Context, kind, id string, days int) (Report, error) {
	if days < 1 || days > MaxDays {
		return Report{}, fmt.Errorf("read usage: days %d not in 1..%d", days, MaxDays)
	}
	var rep Report
	path := "/v1/usage/" + url.PathEscape(kind) + "/" + url.PathEscape(id) + "?days=" + strconv.Itoa(days)
	if _, err := c.api.Do(ctx, httpapi.Call{Method: http.MethodGet, Path: path, Out: &rep}); err != nil {
		var pe *httpapi.Error
		if errors.As(err, &pe) {
			return Report{}, fmt.Errorf("read usage: quota service answered %d %s", pe.Status, pe.Detail)
		}
		return Report{}, fmt.Errorf("read usage: %w", err)
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
