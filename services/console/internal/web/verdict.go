package web

import (
	"context"
	"fmt"
	"net/http"
	"net/url"
	"strings"
	"time"

	"github.com/segmentio/kafka-go"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/precision"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// VerdictPublisher publishes a verdict.v1 event (acks=all).
type VerdictPublisher interface {
	Publish(ctx context.Context, v *events.Verdict) error
}

// KafkaVerdicts publishes verdicts on the verdicts topic with the
// CloudEvents headers, keyed by the principal.
type KafkaVerdicts struct {
	Producer *stream.Producer // its default topic is the verdicts topic
	Source   string           // ce_source, e.g. floodgate/console
}

// Publish encodes v (validating it) and writes it.
func (k *KafkaVerdicts) Publish(ctx context.Context, v *events.Verdict) error {
	body, err := events.EncodeVerdict(v)
	if err != nil {
		return err
	}
	msg := kafka.Message{Key: []byte(v.Key()), Value: body,
		Headers: stream.CloudEventHeaders(events.CETypeVerdict, v.ID, k.Source, v.TS)}
	if id := httpapi.RequestID(ctx); id != "" {
		msg.Headers = append(msg.Headers, kafka.Header{Key: httpapi.KafkaHeaderRequestID, Value: []byte(id)})
	}
	return k.Producer.Publish(ctx, msg)
}

// verdictRequest is POST /api/v1/verdicts as JSON (the alert page and API
// callers may post the same names as a form).
type verdictRequest struct {
	Principal string `json:"principal"` // kind:id
	Key       string `json:"key"`       // the alert's key (detected_at#id)
	Verdict   string `json:"verdict"`   // confirmed | false_positive | unsure
	Reason    string `json:"reason"`
	// AllowlistFor is how long a false positive's principal is allowlisted
	// (e.g. 6h, 7d); required for a false positive.
	AllowlistFor string `json:"allowlist_for"`
}

func (s *Server) readVerdict(r *http.Request) (verdictRequest, error) {
	return readAction(r, func() verdictRequest {
		return verdictRequest{Principal: r.PostFormValue("p"), Key: r.PostFormValue("k"), Verdict: r.PostFormValue("verdict"),
			Reason: r.PostFormValue("reason"), AllowlistFor: r.PostFormValue("duration")}
	})
}

var verdictDone = map[events.VerdictValue]string{
	events.VerdictConfirmed:     "verdict_confirmed",
	events.VerdictFalsePositive: "verdict_false_positive",
	events.VerdictUnsure:        "verdict_unsure",
}

func init() {
	doneMessages["verdict_confirmed"] = "Verdict recorded: the detection was right."
	doneMessages["verdict_unsure"] = "Verdict recorded: unsure."
	doneMessages["verdict_false_positive"] = "Verdict recorded: false positive. The penalty is lifted (the limiter stops applying it at the principal's next check) and the principal is allowlisted."
}

// verdict is POST /alert/verdict and POST /api/v1/verdicts: a reviewer's
// verdict on one detection (analyst role), stored on its abuse record with
// an audit row and published as verdict.v1. A false positive lifts the
// principal's penalty at once and allowlists it for the stated time.
func (s *Server) verdict(w http.ResponseWriter, r *http.Request) {
	const action = store.ActionVerdict
	in, err := s.readVerdict(r)
	if err != nil {
		s.metrics.actions.WithLabelValues(action, "refused").Inc()
		s.fail(w, r, http.StatusBadRequest, err.Error())
		return
	}
	a, ok := s.actionAlert(w, r, action, in.Principal, in.Key)
	if !ok {
		return
	}
	who := s.actor(r)
	who.Reason = strings.TrimSpace(in.Reason)
	value := events.VerdictValue(in.Verdict)
	v, code, err := s.judge(r, a, value, in.AllowlistFor, who)
	if err != nil {
		if code >= 500 {
			s.cfg.Log.Error("verdict failed", "principal", a.Principal, "abuse_id", a.ID, "actor", who.Name, "err", err, "correlation_id", who.CorrelationID)
		}
		s.refuse(w, r, action, code, err.Error(), func(msg string) { s.alertAgain(w, r, code, a.Principal, a.SK, msg) })
		return
	}
	body := map[string]any{"ok": true, "action": action, "principal": a.Principal, "abuse_id": a.ID, "verdict": v.Value,
		"verdict_id": v.ID, "penalty_lifted": v.PenaltyLifted}
	if !v.AllowUntil.IsZero() {
		body["allowlisted_until"] = v.AllowUntil.Format(time.RFC3339)
	}
	s.succeeded(w, r, action, who, body,
		"/alert?p="+url.QueryEscape(a.Principal)+"&k="+url.QueryEscape(a.SK)+"&done="+verdictDone[v.Value],
		"principal", a.Principal, "abuse_id", a.ID, "verdict", v.Value, "penalty_lifted", v.PenaltyLifted)
}

// judge stores the verdict and publishes it; the code is the answer's
// status when err is set.
func (s *Server) judge(r *http.Request, a store.Alert, value events.VerdictValue, allowFor string, who store.Actor) (store.Verdict, int, error) {
	if !value.Valid() {
		return store.Verdict{}, http.StatusUnprocessableEntity, fmt.Errorf("%w: verdict %q is not one of confirmed|false_positive|unsure", store.ErrInvalid, value)
	}
	j := store.Judgement{Value: value, Route: precision.Route(a.Event), Network: s.cfg.Networks.Network(a.Event)}
	if value == events.VerdictFalsePositive {
		if strings.TrimSpace(allowFor) == "" {
			return store.Verdict{}, http.StatusUnprocessableEntity, fmt.Errorf("%w: a false positive needs how long to allowlist the principal (e.g. 7d)", store.ErrInvalid)
		}
		until, err := parseUntil(s.cfg.Now(), allowFor)
		if err != nil {
			return store.Verdict{}, http.StatusUnprocessableEntity, err
		}
		j.AllowUntil = until
	}
	v, err := s.cfg.Store.Judge(r.Context(), a, j, who)
	if err != nil {
		return v, actionCode(err), err
	}
	if s.cfg.Verdicts == nil {
		return v, 0, nil
	}
	ev := verdictEvent(a, v)
	if err := s.cfg.Verdicts.Publish(r.Context(), &ev); err != nil {
		return v, http.StatusServiceUnavailable, fmt.Errorf("the verdict is stored (and a false positive's penalty lifted), but its verdict.v1 event could not be published: %w; give the verdict again to publish it", err)
	}
	return v, 0, nil
}

// verdictEvent is the verdict.v1 of a stored verdict.
func verdictEvent(a store.Alert, v store.Verdict) events.Verdict {
	kind, id := a.PrincipalParts()
	ev := events.Verdict{ID: v.ID, TS: v.At.Truncate(time.Millisecond), AbuseID: a.ID, DetectedAt: a.DetectedAt,
		Principal: events.Principal{Kind: events.PrincipalKind(kind), ID: id}, Pattern: events.Pattern(a.Pattern),
		Verdict: v.Value, Reason: v.Reason, Reviewer: v.Reviewer, DetectorVersion: a.DetectorVersion, PenaltyLifted: v.PenaltyLifted}
	if !v.AllowUntil.IsZero() {
		ev.AllowlistedUntil = v.AllowUntil.Truncate(time.Millisecond)
	}
	return ev
}
