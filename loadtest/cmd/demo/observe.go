package main

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"maps"
	"net/http"
	"net/url"
	"slices"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// note is something the services behind the limiter and the detector did,
// for the live table and the summary.
type note struct {
	line string
	// one of these is set
	quotaUnits   int64     // the quota ledger's count of today's units for the watched principal
	adjusterTick time.Time // a new tick of the adjuster
	fresh        []string  // with adjusterTick: the signals it read fresh
	deadLetter   string    // a demo dead letter recorded by the dlq-auditor (its record id)
}

// observer reads the quota usage API, the adjuster's status and the
// dlq-auditor's records with the tokens the console uses.
type observer struct {
	client                              *http.Client
	quotaURL, adjusterURL, dlqURL       string
	quotaToken, adjusterToken, dlqToken string
	principalKind, principalID          string // whose usage is read
	decisionsTopic                      string
	deadLetterKey                       string // the key of the demo's dead letter
	since                               time.Time
}

// watch polls every interval until ctx is done and sends what changed.
func (o *observer) watch(ctx context.Context, interval time.Duration, out chan<- note) {
	var lastUnits int64
	var lastTick time.Time
	seen := map[string]bool{}
	send := func(n note) bool {
		select {
		case out <- n:
			return true
		case <-ctx.Done():
			return false
		}
	}
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		if units, err := o.quotaToday(ctx); err == nil && units > 0 && lastUnits == 0 {
			lastUnits = units
			if !send(note{quotaUnits: units, line: fmt.Sprintf(">> quota ledger: %s:%s has %d units today (usage API %s)",
				o.principalKind, o.principalID, units, o.quotaURL)}) {
				return
			}
		}
		if st, err := o.adjusterStatus(ctx); err == nil && !st.At.IsZero() && st.At.After(lastTick) {
			lastTick = st.At
			if !send(note{adjusterTick: st.At, fresh: st.fresh(), line: ">> adjuster tick at " + st.At.UTC().Format("15:04:05") + ": " + st.String()}) {
				return
			}
		}
		if recs, err := o.deadLetters(ctx); err == nil {
			for _, r := range recs {
				if seen[r.ID] {
					continue
				}
				seen[r.ID] = true
				if !send(note{deadLetter: r.ID, line: fmt.Sprintf(">> dlq-auditor recorded the demo dead letter %s (%s, group %s, class %s)",
					r.ID, r.Service, r.ConsumerGroup, r.Class)}) {
					return
				}
			}
		}
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
	}
}

func (o *observer) get(ctx context.Context, u, token string, v any) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, u, nil)
	if err != nil {
		return err
	}
	req.Header.Set("Authorization", "Bearer "+token)
	res, err := o.client.Do(req)
	if err != nil {
		return err
	}
	defer res.Body.Close()
	if res.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(res.Body, 512))
		return fmt.Errorf("GET %s: %s: %s", u, res.Status, strings.TrimSpace(string(b)))
	}
	return json.NewDecoder(io.LimitReader(res.Body, 4<<20)).Decode(v)
}

// quotaToday reads the watched principal's units today from the quota usage API.
func (o *observer) quotaToday(ctx context.Context) (int64, error) {
	var u struct {
		Today int64 `json:"today"`
	}
	err := o.get(ctx, o.quotaURL+"/v1/usage/"+url.PathEscape(o.principalKind)+"/"+url.PathEscape(o.principalID)+"?days=1", o.quotaToken, &u)
	return u.Today, err
}

// adjusterStatus is the part of the adjuster's GET /v1/status the demo shows.
type adjusterStatus struct {
	At      time.Time           `json:"at"`
	DryRun  bool                `json:"dry_run"`
	Scales  map[string]float64  `json:"scales"`
	Signals map[string]*float64 `json:"signals"`
	Stale   []string            `json:"stale"`
	Engaged map[string][]string `json:"engaged"`
}

// fresh are the signals the tick read, neither missing nor stale.
func (s adjusterStatus) fresh() []string {
	var out []string
	for k, v := range s.Signals {
		if v != nil && !slices.Contains(s.Stale, k) {
			out = append(out, k)
		}
	}
	slices.Sort(out)
	return out
}

func (s adjusterStatus) String() string {
	var b strings.Builder
	b.WriteString("scales")
	for _, k := range slices.Sorted(maps.Keys(s.Scales)) {
		fmt.Fprintf(&b, " %s=%.2f", k, s.Scales[k])
	}
	b.WriteString("; signals")
	for _, k := range slices.Sorted(maps.Keys(s.Signals)) {
		if v := s.Signals[k]; v != nil {
			fmt.Fprintf(&b, " %s=%.2f", k, *v)
		} else {
			fmt.Fprintf(&b, " %s=missing", k)
		}
	}
	if len(s.Engaged) > 0 {
		b.WriteString("; rules engaged:")
		for _, k := range slices.Sorted(maps.Keys(s.Engaged)) {
			fmt.Fprintf(&b, " %s(%s)", k, strings.Join(s.Engaged[k], ","))
		}
	}
	if s.DryRun {
		b.WriteString("; dry run")
	}
	return b.String()
}

func (o *observer) adjusterStatus(ctx context.Context) (adjusterStatus, error) {
	var s adjusterStatus
	err := o.get(ctx, o.adjusterURL+"/v1/status", o.adjusterToken, &s)
	return s, err
}

// dlqRecord is the part of a dlq-auditor record the demo reads.
type dlqRecord struct {
	ID            string `json:"id"`
	Service       string `json:"service"`
	ConsumerGroup string `json:"consumer_group"`
	Class         string `json:"class"`
	Key           []byte `json:"key"`
}

// deadLetters lists the dlq-auditor's records of the demo's dead letter.
func (o *observer) deadLetters(ctx context.Context) ([]dlqRecord, error) {
	var page struct {
		Records []dlqRecord `json:"records"`
	}
	q := url.Values{"topic": {o.decisionsTopic}, "from": {o.since.UTC().Format(time.RFC3339Nano)}, "limit": {"1000"}}
	if err := o.get(ctx, o.dlqURL+"/v1/records?"+q.Encode(), o.dlqToken, &page); err != nil {
		return nil, err
	}
	page.Records = slices.DeleteFunc(page.Records, func(r dlqRecord) bool { return string(r.Key) != o.deadLetterKey })
	return page.Records, nil
}

// sendDeadLetter publishes a message on the decisions topic that is not a
// decision.v1 event, labeled as the demo's: every consumer of the topic
// (the detector, the quota ledger) dead-letters it, and the dlq-auditor
// records the dead letters.
func sendDeadLetter(ctx context.Context, sec *stream.Security, brokers []string, topic, key string) error {
	w := &kafka.Writer{Addr: kafka.TCP(brokers...), Topic: topic, RequiredAcks: kafka.RequireAll, AllowAutoTopicCreation: false, Transport: sec.Transport()}
	defer w.Close()
	return w.WriteMessages(ctx, kafka.Message{
		Key:     []byte(key),
		Value:   []byte(`{"demo":"a dead letter on purpose: this message is not a decision.v1 event, so each consumer of the topic dead-letters it"}`),
		Headers: []kafka.Header{{Key: "floodgate_demo", Value: []byte("dead letter on purpose")}},
	})
}
