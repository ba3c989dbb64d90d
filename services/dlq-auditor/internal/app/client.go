package app

import (
	"context"
	"encoding/json"
	"errors"
	"flag"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"strconv"
	"text/tabwriter"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/api"
	"github.com/floodgate-dev/floodgate/services/dlq-auditor/internal/auditor"
)

// ErrUsage is wrapped by errors about the command line.
var ErrUsage = errors.New("usage")

// APIError is an error answer of the API: an RFC 9457 problem.
type APIError = httpapi.Error

type client struct{ api *httpapi.Client }

func (c *client) do(ctx context.Context, method, path string, query url.Values, body, out any) error {
	if len(query) > 0 {
		path += "?" + query.Encode()
	}
	_, err := c.api.Do(ctx, httpapi.Call{Method: method, Path: path, Body: body, Out: out})
	return err
}

func writeJSON(w io.Writer, v any) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(v)
}

// runClient runs one client subcommand against the API.
func runClient(ctx context.Context, cmd string, args []string, getenv config.Getenv, stdout io.Writer) error {
	if cmd == "token" {
		return tokenCmd(args, stdout)
	}
	env := config.NewEnv(getenv)
	token := env.String("FLOODGATE_DLQ_TOKEN", "")
	apiClient, err := httpapi.NewClient(httpapi.ClientConfig{Name: "dlq-auditor", BaseURL: env.String("FLOODGATE_DLQ_URL", "http://"+auditor.DefaultAddr),
		Token: token, Timeout: 30 * time.Minute, // a replay at a low rate takes a while
		MaxBody: 64 << 20})
	if err != nil {
		return fmt.Errorf("%w: FLOODGATE_DLQ_URL: %w", ErrUsage, err)
	}
	c := &client{api: apiClient}
	fs := flag.NewFlagSet(cmd, flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	topic := fs.String("topic", "", "source topic (or its .dlq topic)")
	service := fs.String("service", "", "service that dead-lettered")
	class := fs.String("class", "", "error class: poison|transient_exhausted|handler_panic|invalid_record")
	group := fs.String("group", "", "consumer group (completeness)")
	from := fs.String("from", "", "start of the time range, RFC 3339")
	to := fs.String("to", "", "end of the time range, RFC 3339")
	limit := fs.Int("limit", 100, "most records to list (or to select for a replay)")
	asJSON := fs.Bool("json", false, "print JSON")
	reason := fs.String("reason", "", "why (recorded in the audit log)")
	canary := fs.Int("canary", 1, "records replayed first and watched")
	rate := fs.Float64("rate", 0, "messages per second (0: the server's limit)")
	var known = map[string]bool{"list": true, "inspect": true, "replay": true, "purge": true, "completeness": true}
	if !known[cmd] {
		return fmt.Errorf("%w: unknown command %q\n%s", ErrUsage, cmd, Usage)
	}
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: %s: %w", ErrUsage, cmd, err)
	}
	if token == "" {
		return fmt.Errorf("%w: FLOODGATE_DLQ_TOKEN is not set", ErrUsage)
	}
	filter := url.Values{}
	for k, v := range map[string]string{"topic": *topic, "service": *service, "class": *class, "from": *from, "to": *to} {
		if v != "" {
			filter.Set(k, v)
		}
	}
	switch cmd {
	case "list":
		filter.Set("limit", strconv.Itoa(*limit))
		var page auditor.Page
		if err := c.do(ctx, http.MethodGet, "/v1/records", filter, nil, &page); err != nil {
			return err
		}
		if *asJSON {
			return writeJSON(stdout, page)
		}
		tw := tabwriter.NewWriter(stdout, 2, 4, 2, ' ', 0)
		fmt.Fprintln(tw, "ID\tDEAD-LETTERED\tSERVICE\tGROUP\tCLASS\tSOURCE\tREPLAYS\tERROR")
		for _, r := range page.Records {
			msg := r.ErrorMessage
			if len(msg) > 80 {
				msg = msg[:77] + "..."
			}
			fmt.Fprintf(tw, "%s\t%s\t%s\t%s\t%s\t%s/%d@%d\t%d\t%s\n", r.ID, r.DeadLetteredAt.Format(time.RFC3339), r.Service,
				r.ConsumerGroup, r.Class, r.SourceTopic, r.SourcePartition, r.SourceOffset, r.Replays, msg)
		}
		if page.Cursor != "" {
			fmt.Fprintf(tw, "(more: narrow the time range or raise -limit)\n")
		}
		return tw.Flush()
	case "inspect":
		if fs.NArg() != 1 {
			return fmt.Errorf("%w: inspect takes one record id", ErrUsage)
		}
		var out api.Inspection
		if err := c.do(ctx, http.MethodGet, "/v1/records/"+url.PathEscape(fs.Arg(0)), nil, nil, &out); err != nil {
			return err
		}
		return writeJSON(stdout, out)
	case "replay":
		ids := fs.Args()
		if len(ids) == 0 {
			// Select with the list filters.
			filter.Set("limit", strconv.Itoa(*limit))
			var page auditor.Page
			if err := c.do(ctx, http.MethodGet, "/v1/records", filter, nil, &page); err != nil {
				return err
			}
			for _, r := range page.Records {
				ids = append(ids, r.ID)
			}
			if len(ids) == 0 {
				return fmt.Errorf("%w: nothing matches the filter", ErrUsage)
			}
		}
		var out dlqapi.ReplayResult
		if err := c.do(ctx, http.MethodPost, "/v1/replays", nil,
			api.ReplayBody{IDs: ids, Canary: *canary, Rate: *rate, Reason: *reason}, &out); err != nil {
			return err
		}
		if err := writeJSON(stdout, out); err != nil {
			return err
		}
		if out.Aborted {
			return fmt.Errorf("replay %s aborted: %s", out.ReplayID, out.AbortReason)
		}
		return nil
	case "purge":
		if fs.NArg() == 0 {
			return fmt.Errorf("%w: purge takes record ids", ErrUsage)
		}
		var out dlqapi.PurgeResult
		if err := c.do(ctx, http.MethodPost, "/v1/purges", nil, api.PurgeBody{IDs: fs.Args(), Reason: *reason}, &out); err != nil {
			return err
		}
		return writeJSON(stdout, out)
	default: // completeness
		q := url.Values{"topic": {*topic}, "group": {*group}}
		if *from != "" {
			q.Set("from", *from)
		}
		if *to != "" {
			q.Set("to", *to)
		}
		var rep auditor.CompletenessReport
		if err := c.do(ctx, http.MethodGet, "/v1/completeness", q, nil, &rep); err != nil {
			return err
		}
		if err := writeJSON(stdout, rep); err != nil {
			return err
		}
		if rep.Unaccounted > 0 {
			return fmt.Errorf("%d events unaccounted for", rep.Unaccounted)
		}
		return nil
	}
}

func tokenCmd(args []string, stdout io.Writer) error {
	fs := flag.NewFlagSet("token", flag.ContinueOnError)
	fs.SetOutput(io.Discard)
	name := fs.String("name", "", "who the token is for")
	role := fs.String("role", api.RoleViewer, "viewer or sre")
	if err := fs.Parse(args); err != nil {
		return fmt.Errorf("%w: token: %w", ErrUsage, err)
	}
	token, line, err := api.NewToken(*name, *role)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrUsage, err)
	}
	_, err = fmt.Fprintf(stdout, "token: %s\nFLOODGATE_DLQ_TOKENS entry (the server keeps only the hash):\n%s\n", token, line)
	return err
}
