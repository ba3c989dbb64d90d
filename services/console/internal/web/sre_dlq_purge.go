package web

import (
	"fmt"
	"net/http"

	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// actionDLQPurge is the console's audit action for a purge through the dlq-auditor.
const actionDLQPurge = "dlq.purge"

type dlqPurgeView struct {
	Title  string
	IDs    []string
	Reason string
}

// dlqPurge deletes the selected stored dead letters through the auditor
// (POST /v1/purges, role sre there too) in two steps: without confirm=yes it
// shows what would be purged and asks; with it, it purges and writes the
// console's audit row.
func (s *Server) dlqPurge(w http.ResponseWriter, r *http.Request) {
	_ = r.ParseForm()
	ids := r.PostForm["id"]
	who := s.actor(r)
	refuse := func(code int, msg string) {
		s.refuse(w, r, actionDLQPurge, code, msg, func(msg string) {
			v := s.loadDLQ(r, "", "24h")
			v.Errors = append([]string{msg}, v.Errors...)
			s.renderCode(w, r, code, "dlq", v)
		})
	}
	if code, msg := s.checkDLQSelection(ids, who, "purge"); code != 0 {
		refuse(code, msg)
		return
	}
	if r.PostFormValue("confirm") != "yes" {
		if wantsJSON(r) {
			s.fail(w, r, http.StatusPreconditionRequired, "a purge cannot be undone: send confirm=yes")
			return
		}
		s.render(w, r, "dlqpurge", dlqPurgeView{Title: "Purge dead letters?", IDs: ids, Reason: who.Reason})
		return
	}
	res, err := s.cfg.DLQ.Purge(r.Context(), ids, who.Reason+" (console user "+who.Name+")", who.CorrelationID)
	if err != nil {
		s.dlqFailed(refuse, "purge", "some records may have been purged (each one it purged is in its audit trail)", who, err)
		return
	}
	after := map[string]any{"purged": res.Purged, "items": res.Items}
	if err := s.cfg.Store.RecordRemote(r.Context(), store.SubjectDLQ, actionDLQPurge, "", who, map[string]any{"ids": ids}, after); err != nil {
		s.metrics.actions.WithLabelValues(actionDLQPurge, "audit_error").Inc()
		s.cfg.Log.Error("console audit row", "action", actionDLQPurge, "err", err, "correlation_id", who.CorrelationID)
		s.fail(w, r, http.StatusServiceUnavailable, fmt.Sprintf("The purge ran (%d purged, each audited by the dlq-auditor) but the console's own audit row failed: %v", res.Purged, err))
		return
	}
	s.metrics.actions.WithLabelValues(actionDLQPurge, "ok").Inc()
	s.cfg.Log.Info("action", "action", actionDLQPurge, "actor", who.Name, "purged", res.Purged, "correlation_id", who.CorrelationID)
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, res)
		return
	}
	v := s.loadDLQ(r, "", "24h")
	v.Purged = &res
	s.render(w, r, "dlq", v)
}
