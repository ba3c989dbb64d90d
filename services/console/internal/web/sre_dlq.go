package web

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"net/http"
	"sort"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dlqapi"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/dlq"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// dlqTopics are the source topics whose dead letters the summary counts.
var dlqTopics = []string{config.DefaultDecisionsTopic, config.DefaultAbuseTopic, config.DefaultAdjustmentsTopic}

// dlqMaxPerTopic bounds how many records the summary reads per topic.
const dlqMaxPerTopic = 5000

type dlqCount struct {
	Topic, Service, Class string
	Count                 int
}

type dlqView struct {
	Title     string
	Window    string
	Windows   []struct{ Value, Label string }
	Topic     string
	Topics    []string
	Counts    []dlqCount
	Total     int
	Truncated bool
	Records   []dlq.Record
	CanReplay bool
	Result    *dlqapi.ReplayResult
	Purged    *dlqapi.PurgeResult
	Console   []store.AuditEntry
	Errors    []string
}

func (s *Server) loadDLQ(r *http.Request, topicFilter, window string) dlqView {
	v := dlqView{Title: "Dead letters", Windows: windows, Topics: dlqTopics, Topic: topicFilter, Window: window,
		CanReplay: current(r).who.Role.Allows(auth.RoleSRE)}
	if s.cfg.DLQ == nil {
		v.Errors = append(v.Errors, "No dlq-auditor is configured (FLOODGATE_CONSOLE_DLQ_URL, FLOODGATE_CONSOLE_DLQ_TOKEN).")
		v.CanReplay = false
		return v
	}
	win, err := time.ParseDuration(window)
	if err != nil || win <= 0 || win > 31*24*time.Hour {
		v.Errors = append(v.Errors, "window must be a duration up to 744h")
		win, v.Window = 24*time.Hour, "24h"
	}
	to := s.cfg.Now()
	counts := map[dlqCount]int{}
	for _, topic := range dlqTopics {
		recs, more, err := s.cfg.DLQ.List(r.Context(), topic, "", to.Add(-win), to, dlqMaxPerTopic)
		if err != nil {
			v.Errors = append(v.Errors, "Dead letters of "+topic+" unavailable: "+err.Error())
			continue
		}
		v.Truncated = v.Truncated || more
		for _, rec := range recs {
			counts[dlqCount{Topic: topic, Service: rec.Service, Class: rec.Class}]++
			if topicFilter == "" || topicFilter == topic {
				v.Records = append(v.Records, rec)
			}
		}
	}
	for k, n := range counts {
		k.Count = n
		v.Counts = append(v.Counts, k)
		v.Total += n
	}
	sort.Slice(v.Counts, func(i, j int) bool {
		a, b := v.Counts[i], v.Counts[j]
		if a.Count != b.Count {
			return a.Count > b.Count
		}
		return a.Topic+a.Service+a.Class < b.Topic+b.Service+b.Class
	})
	sort.Slice(v.Records, func(i, j int) bool { return v.Records[i].DeadLetteredAt.After(v.Records[j].DeadLetteredAt) })
	if len(v.Records) > 200 {
		v.Records = v.Records[:200]
	}
	if v.Console, err = s.cfg.Store.AuditOf(r.Context(), store.SubjectDLQ, 20); err != nil {
		v.Errors = append(v.Errors, "Console audit log unavailable: "+err.Error())
	}
	return v
}

func (s *Server) dlqPage(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	window := q.Get("window")
	if window == "" {
		window = "24h"
	}
	topic := q.Get("topic")
	if topic != "" && !oneOf(topic, dlqTopics) {
		s.fail(w, r, http.StatusBadRequest, "topic must be one of "+strings.Join(dlqTopics, ", "))
		return
	}
	v := s.loadDLQ(r, topic, window)
	if s.cfg.DLQ == nil || (len(v.Errors) > 0 && v.Total == 0 && len(v.Counts) == 0) {
		w.WriteHeader(http.StatusServiceUnavailable)
	}
	s.render(w, r, "dlq", v)
}

type dlqRecordView struct {
	Title     string
	Ins       dlq.Inspection
	Payload   string
	CanReplay bool
	Errors    []string
}

func (s *Server) dlqRecord(w http.ResponseWriter, r *http.Request) {
	if s.cfg.DLQ == nil {
		s.fail(w, r, http.StatusServiceUnavailable, "no dlq-auditor is configured")
		return
	}
	id := r.URL.Query().Get("id")
	ins, err := s.cfg.DLQ.Inspect(r.Context(), id)
	var de *dlq.Error
	switch {
	case errors.As(err, &de) && de.Status == http.StatusNotFound:
		s.fail(w, r, http.StatusNotFound, "no such dead letter (it may have expired): "+id)
		return
	case errors.As(err, &de):
		s.fail(w, r, de.Status, de.Message)
		return
	case err != nil:
		s.fail(w, r, http.StatusBadGateway, "the dlq-auditor could not be reached: "+err.Error())
		return
	}
	v := dlqRecordView{Title: "Dead letter " + ins.Record.ID, Ins: ins, CanReplay: current(r).who.Role.Allows(auth.RoleSRE)}
	if len(ins.Payload) > 0 {
		var buf bytes.Buffer
		if json.Indent(&buf, ins.Payload, "", "  ") == nil {
			v.Payload = buf.String()
		}
	}
	s.render(w, r, "dlqrecord", v)
}

// dlqReplay replays the selected records through the auditor (canary first)
// and writes the console's audit row; the page shows each record's outcome.
func (s *Server) dlqReplay(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	ids := r.PostForm["id"]
	who := s.actor(r)
	v := s.loadDLQ(r, "", "24h")
	refuse := func(code int, msg string) {
		s.refuse(w, r, store.ActionDLQReplay, code, msg, func(msg string) {
			v.Errors = append([]string{msg}, v.Errors...)
			s.renderCode(w, r, code, "dlq", v)
		})
	}
	if code, msg := s.checkDLQSelection(ids, who, "replay"); code != 0 {
		refuse(code, msg)
		return
	}
	res, err := s.cfg.DLQ.Replay(r.Context(), ids, who.Reason+" (console user "+who.Name+")", who.CorrelationID)
	if err != nil {
		s.dlqFailed(refuse, "replay", "the replay may have run in part (each record it published is in its audit trail)", who, err)
		return
	}
	after := map[string]any{"replay_id": res.ReplayID, "published": res.Published, "failed": res.Failed, "aborted": res.Aborted, "abort_reason": res.AbortReason}
	if err := s.cfg.Store.RecordRemote(r.Context(), store.SubjectDLQ, store.ActionDLQReplay, res.ReplayID, who, map[string]any{"ids": ids}, after); err != nil {
		s.metrics.actions.WithLabelValues(store.ActionDLQReplay, "audit_error").Inc()
		s.cfg.Log.Error("console audit row", "action", store.ActionDLQReplay, "replay_id", res.ReplayID, "err", err, "correlation_id", who.CorrelationID)
		s.fail(w, r, http.StatusServiceUnavailable, fmt.Sprintf("The replay ran (replay id %s, audited by the dlq-auditor) but the console's own audit row failed: %v", res.ReplayID, err))
		return
	}
	s.metrics.actions.WithLabelValues(store.ActionDLQReplay, map[bool]string{true: "aborted", false: "ok"}[res.Aborted]).Inc()
	s.cfg.Log.Info("action", "action", store.ActionDLQReplay, "actor", who.Name, "replay_id", res.ReplayID, "published", res.Published, "correlation_id", who.CorrelationID)
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, res)
		return
	}
	v = s.loadDLQ(r, "", "24h")
	v.Result = &res
	s.render(w, r, "dlq", v)
}

// checkDLQSelection validates a replay or purge request; code 0 means valid.
func (s *Server) checkDLQSelection(ids []string, who store.Actor, verb string) (int, string) {
	switch {
	case s.cfg.DLQ == nil:
		return http.StatusServiceUnavailable, "no dlq-auditor is configured"
	case len(ids) == 0:
		return http.StatusUnprocessableEntity, "select at least one dead letter to " + verb
	case len(ids) > 1000:
		return http.StatusUnprocessableEntity, "at most 1000 dead letters per " + verb
	case who.Reason == "":
		return http.StatusUnprocessableEntity, "a reason is required"
	case len(who.Reason) > store.MaxReason:
		return http.StatusUnprocessableEntity, fmt.Sprintf("the reason is longer than %d bytes", store.MaxReason)
	}
	return 0, ""
}

// dlqFailed answers an auditor call for verb that did not succeed: a 4xx is
// the auditor's refusal, passed on with its status; anything else (a 5xx, no
// answer) is a failure that may have done part of the work — partly says
// what — answered 502 and logged.
func (s *Server) dlqFailed(refuse func(code int, msg string), verb, partly string, who store.Actor, err error) {
	var de *dlq.Error
	if errors.As(err, &de) && de.Status < 500 {
		refuse(de.Status, "The dlq-auditor refused the "+verb+": "+de.Message)
		return
	}
	s.cfg.Log.Error("dlq "+verb, "err", err, "correlation_id", who.CorrelationID)
	refuse(http.StatusBadGateway, "The dlq-auditor failed or could not be reached; "+partly+": "+err.Error())
}
