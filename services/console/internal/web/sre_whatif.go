package web

import (
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"net/http"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/limiter"
	"github.com/floodgate-dev/floodgate/pkg/whatif"
	"github.com/floodgate-dev/floodgate/services/console/internal/auth"
	"github.com/floodgate-dev/floodgate/services/console/internal/store"
)

// The what-if page's audit rows: one per run, with the range, the rules'
// digests and the outcome.
const (
	SubjectWhatIf = "console#whatif"
	ActionWhatIf  = "whatif.run"
)

// maxRulesForm bounds a pasted rules file.
const maxRulesForm = 256 << 10

// WhatIf runs the SRE page's what-if replays (pkg/whatif), one at a time per
// console: a replay is as heavy as the traffic it reads.
type WhatIf struct {
	Source  *whatif.Source        // the decisions topic; MaxEvents bounds one run
	Redis   redis.UniversalClient // where the replay's isolated keyspace lives
	Timeout time.Duration         // bounds one run (under the console's write timeout)
	mu      sync.Mutex
}

// errBusy: another what-if is running on this console.
var errBusy = errors.New("another what-if is running on this console; try again when it has finished")

func (w *WhatIf) run(ctx context.Context, from, to time.Time, c whatif.Config) (*whatif.Report, error) {
	if !w.mu.TryLock() {
		return nil, errBusy
	}
	defer w.mu.Unlock()
	ctx, cancel := context.WithTimeout(ctx, w.Timeout)
	defer cancel()
	c.Redis = w.Redis
	return whatif.Run(ctx, w.Source, from, to, c)
}

type whatIfForm struct {
	Rules, Baseline, From, To, RejectCritical, Reason string
}

type whatIfView struct {
	Title     string
	CanRun    bool
	Enabled   bool
	MaxEvents int
	Form      whatIfForm
	Report    *whatif.Report
	Errors    []string
	Audit     []store.AuditEntry
}

func (s *Server) whatIfView(r *http.Request, f whatIfForm) whatIfView {
	v := whatIfView{Title: "What-if replay", CanRun: current(r).who.Role.Allows(auth.RoleSRE), Enabled: s.cfg.WhatIf != nil, Form: f}
	if v.Enabled {
		v.MaxEvents = s.cfg.WhatIf.Source.MaxEvents
	}
	var err error
	if v.Audit, err = s.cfg.Store.AuditOf(r.Context(), SubjectWhatIf, 20); err != nil {
		v.Errors = append(v.Errors, "Console audit log unavailable: "+err.Error())
	}
	return v
}

func (s *Server) whatIfPage(w http.ResponseWriter, r *http.Request) {
	s.render(w, r, "whatif", s.whatIfView(r, whatIfForm{From: "1h", To: "now", RejectCritical: "5"}))
}

// whatIfRun replays the range through the pasted candidate and shows the
// report; the run (range, rules digests, outcome) is audited, and a report
// whose run could not be audited is not shown.
func (s *Server) whatIfRun(w http.ResponseWriter, r *http.Request) {
	f := whatIfForm{Rules: r.PostFormValue("rules"), Baseline: r.PostFormValue("baseline"), From: r.PostFormValue("from"),
		To: r.PostFormValue("to"), RejectCritical: strings.TrimSpace(r.PostFormValue("reject_critical")), Reason: strings.TrimSpace(r.PostFormValue("reason"))}
	refuse := func(code int, msgs ...string) {
		s.refuse(w, r, ActionWhatIf, code, strings.Join(msgs, "; "), func(string) {
			v := s.whatIfView(r, f)
			v.Errors = append(msgs, v.Errors...)
			s.renderCode(w, r, code, "whatif", v)
		})
	}
	if s.cfg.WhatIf == nil {
		refuse(http.StatusServiceUnavailable, "What-if replays are not configured on this console (no decisions topic).")
		return
	}
	now := s.cfg.Now()
	var bad []string
	if f.Reason == "" {
		bad = append(bad, "reason: required (it goes into the audit log)")
	}
	if len(f.Rules) > maxRulesForm || len(f.Baseline) > maxRulesForm {
		bad = append(bad, fmt.Sprintf("rules: at most %d KiB each", maxRulesForm>>10))
	}
	from, err := whatif.ParseTime(f.From, now)
	if err != nil {
		bad = append(bad, "from: "+err.Error())
	}
	to, err2 := whatif.ParseTime(f.To, now)
	if err2 != nil {
		bad = append(bad, "to: "+err2.Error())
	}
	if err == nil && err2 == nil && !from.Before(to) {
		bad = append(bad, "from must be before to")
	}
	th := whatif.Thresholds{}
	if f.RejectCritical != "" {
		pct, err := strconv.ParseFloat(f.RejectCritical, 64)
		if err != nil || pct < 0 || pct > 100 {
			bad = append(bad, "reject threshold: a percentage in 0..100")
		}
		th.RejectCritical = pct / 100
	}
	candidate, err := limiter.ParseRules("candidate", []byte(f.Rules))
	if err != nil {
		bad = append(bad, "candidate rules: "+err.Error())
	}
	var baseline *limiter.Ruleset
	if strings.TrimSpace(f.Baseline) != "" {
		if baseline, err = limiter.ParseRules("baseline", []byte(f.Baseline)); err != nil {
			bad = append(bad, "baseline rules: "+err.Error())
		}
	}
	if len(bad) > 0 {
		refuse(http.StatusUnprocessableEntity, bad...)
		return
	}
	who := s.actor(r)
	rep, runErr := s.cfg.WhatIf.run(r.Context(), from, to, whatif.Config{Candidate: candidate, Baseline: baseline, Thresholds: th,
		Logger: s.cfg.Log, CandidateName: "candidate (pasted)", BaselineName: "baseline (pasted)"})
	if errors.Is(runErr, errBusy) {
		refuse(http.StatusConflict, runErr.Error())
		return
	}
	before := map[string]any{"from": from, "to": to, "rules_sha256": digest(f.Rules), "reject_critical": th.RejectCritical}
	if baseline != nil {
		before["baseline_sha256"] = digest(f.Baseline)
	}
	after := map[string]any{}
	if runErr != nil {
		after["error"] = runErr.Error()
	} else {
		after = map[string]any{"verdict": rep.Verdict, "confidence": rep.Confidence, "replayed": rep.Replayed,
			"blocked_recorded": rep.Total.BlockedRecorded, "blocked_candidate": rep.Total.BlockedCandidate,
			"newly_blocked": rep.Total.NewlyBlocked, "newly_allowed": rep.Total.NewlyAllowed}
	}
	if err := s.cfg.Store.RecordRemote(r.Context(), SubjectWhatIf, ActionWhatIf, "", who, before, after); err != nil {
		s.cfg.Log.Error("audit what-if", "err", err, "correlation_id", who.CorrelationID)
		if errors.Is(err, store.ErrInvalid) {
			refuse(http.StatusUnprocessableEntity, err.Error())
			return
		}
		refuse(http.StatusServiceUnavailable, "The run could not be written to the audit log, so its report is not shown: "+err.Error())
		return
	}
	if runErr != nil {
		s.cfg.Log.Warn("what-if failed", "actor", who.Name, "err", runErr, "correlation_id", who.CorrelationID)
		code := http.StatusBadGateway
		if errors.Is(runErr, whatif.ErrTooMany) {
			code = http.StatusUnprocessableEntity
		}
		refuse(code, "The what-if did not finish: "+runErr.Error())
		return
	}
	s.metrics.actions.WithLabelValues(ActionWhatIf, "ok").Inc()
	s.cfg.Log.Info("action", "action", ActionWhatIf, "actor", who.Name, "verdict", rep.Verdict, "replayed", rep.Replayed,
		"from", from, "to", to, "correlation_id", who.CorrelationID)
	if wantsJSON(r) {
		writeJSON(w, http.StatusOK, rep)
		return
	}
	v := s.whatIfView(r, f)
	v.Report = rep
	s.render(w, r, "whatif", v)
}

func digest(s string) string {
	h := sha256.Sum256([]byte(s))
	return hex.EncodeToString(h[:])
}

type whatIfDim struct {
	Name string
	Rows []whatif.Row
}

// whatIfDims lists a report's dimension tables for the template.
func whatIfDims(r *whatif.Report) []whatIfDim {
	return []whatIfDim{{"priority", r.ByPrio}, {"plan", r.ByPlan}, {"kind", r.ByKind}}
}
