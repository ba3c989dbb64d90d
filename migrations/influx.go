package migrations

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strings"
	"time"
)

// Influx reconciles InfluxDB 1.x databases and retention policies with InfluxQL over
// the /query endpoint. (influxdb-client-go/v2 writes and queries through the 1.8 v2
// compatibility API, which has no bucket management; databases are created here.)
type Influx struct {
	URL   string // e.g. http://127.0.0.1:8086
	Token string // "user:password" when auth is on, or empty
	HTTP  *http.Client
}

// Apply creates each database and makes its retention policy match.
func (x *Influx) Apply(ctx context.Context, specs []DatabaseSpec, report func(string)) error {
	for _, db := range specs {
		if _, err := x.query(ctx, fmt.Sprintf("CREATE DATABASE %s", quoteIdent(db.Name))); err != nil {
			return err
		}
		rp := db.RetentionPolicy
		policies, err := x.query(ctx, fmt.Sprintf("SHOW RETENTION POLICIES ON %s", quoteIdent(db.Name)))
		if err != nil {
			return err
		}
		stmt := "CREATE"
		for _, row := range policies {
			if len(row) > 0 && row[0] == rp.Name {
				stmt = "ALTER"
			}
		}
		q := fmt.Sprintf("%s RETENTION POLICY %s ON %s DURATION %s", stmt, quoteIdent(rp.Name), quoteIdent(db.Name), rp.Duration)
		if stmt == "CREATE" {
			q += " REPLICATION 1"
		}
		if rp.Default {
			q += " DEFAULT"
		}
		if _, err := x.query(ctx, q); err != nil {
			return err
		}
		report(fmt.Sprintf("influxdb database %s: retention policy %s %s (bucket %s/%s)", db.Name, rp.Name, rp.Duration, db.Name, rp.Name))
	}
	return nil
}

// query runs one InfluxQL statement and returns the first series' rows as strings.
func (x *Influx) query(ctx context.Context, q string) ([][]string, error) {
	form := url.Values{"q": {q}}
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(x.URL, "/")+"/query", strings.NewReader(form.Encode()))
	if err != nil {
		return nil, err
	}
	req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
	if user, pass, ok := strings.Cut(x.Token, ":"); ok {
		req.SetBasicAuth(user, pass)
	}
	client := x.HTTP
	if client == nil {
		client = &http.Client{Timeout: 15 * time.Second}
	}
	resp, err := client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("influxdb %q: %w", q, err)
	}
	defer resp.Body.Close()
	body, _ := io.ReadAll(io.LimitReader(resp.Body, 1<<20))
	var out struct {
		Error   string `json:"error"`
		Results []struct {
			Error  string `json:"error"`
			Series []struct {
				Values [][]any `json:"values"`
			} `json:"series"`
		} `json:"results"`
	}
	if err := json.Unmarshal(body, &out); err != nil {
		return nil, fmt.Errorf("influxdb %q: status %d: %s", q, resp.StatusCode, strings.TrimSpace(string(body)))
	}
	if out.Error != "" {
		return nil, fmt.Errorf("influxdb %q: %s", q, out.Error)
	}
	var rows [][]string
	for _, r := range out.Results {
		if r.Error != "" {
			return nil, fmt.Errorf("influxdb %q: %s", q, r.Error)
		}
		for _, s := range r.Series {
			for _, v := range s.Values {
				row := make([]string, len(v))
				for i, cell := range v {
					row[i] = fmt.Sprint(cell)
				}
				rows = append(rows, row)
			}
		}
	}
	return rows, nil
}

func quoteIdent(s string) string { return `"` + strings.ReplaceAll(s, `"`, `\"`) + `"` }
