package whatif

import (
	"cmp"
	"encoding/json"
	"fmt"
	"io"
	"slices"
	"strings"
	"text/tabwriter"
	"time"
)

// Counts compares the recorded decisions of one slice of traffic with the
// candidate's.
type Counts struct {
	Total int `json:"total"` // requests in the slice
	// BlockedRecorded: denied as recorded (by a limit; shed requests are
	// counted apart, in Report.Shed).
	BlockedRecorded int `json:"blocked_recorded"`
	// BlockedCandidate: the candidate would deny.
	BlockedCandidate int `json:"blocked_candidate"`
	NewlyBlocked     int `json:"newly_blocked"` // allowed as recorded, denied by the candidate
	NewlyAllowed     int `json:"newly_allowed"` // denied as recorded, allowed by the candidate
}

func (c *Counts) add(recordedBlocked, candidateBlocked bool) {
	c.Total++
	if recordedBlocked {
		c.BlockedRecorded++
	}
	if candidateBlocked {
		c.BlockedCandidate++
	}
	switch {
	case candidateBlocked && !recordedBlocked:
		c.NewlyBlocked++
	case recordedBlocked && !candidateBlocked:
		c.NewlyAllowed++
	}
}

// AllowedRecorded is the slice's requests that were allowed as recorded.
func (c Counts) AllowedRecorded() int { return c.Total - c.BlockedRecorded }

// Row is the counts of one value of a dimension (a priority, a plan, a kind).
type Row struct {
	Key string `json:"key"`
	Counts
}

// RuleRow is one rule's counts. A rule row counts the requests it decided:
// BlockedRecorded the recorded denials it decided, BlockedCandidate the
// candidate's denials it decides, NewlyBlocked the candidate's new denials
// it decides, NewlyAllowed the recorded denials it decided that the
// candidate allows. Matched is how many requests the candidate's rule was
// evaluated for (0 for a rule the candidate does not have), ShadowBlocked
// how many of them it would have denied in shadow mode.
type RuleRow struct {
	Rule          string `json:"rule"`
	InCandidate   bool   `json:"in_candidate"`
	Matched       int    `json:"matched"`
	ShadowBlocked int    `json:"shadow_blocked"`
	Counts
}

// Affected is one principal or plan the candidate changes most.
type Affected struct {
	Key          string `json:"key"`            // kind:id, or the plan
	Plan         string `json:"plan,omitempty"` // a principal's plan
	Total        int    `json:"total"`
	NewlyBlocked int    `json:"newly_blocked"`
	NewlyAllowed int    `json:"newly_allowed"`
}

// Verdicts.
const (
	VerdictSafe   = "safe"
	VerdictReview = "review"
	VerdictReject = "reject"
)

// Report is a what-if replay's answer.
type Report struct {
	From      time.Time `json:"from"`
	To        time.Time `json:"to"`
	Topic     string    `json:"topic,omitempty"`
	Rules     string    `json:"rules,omitempty"`    // the candidate's file name
	Baseline  string    `json:"baseline,omitempty"` // the baseline's file name
	Read      ReadStats `json:"read"`
	Replayed  int       `json:"replayed"` // decisions run through the candidate
	Shed      int       `json:"shed"`     // recorded as shed by priority: not replayed
	Envoy     int       `json:"envoy"`    // Envoy calls for envoy-configured domains: not replayed
	Degraded  int       `json:"degraded"` // recorded under a fail policy (Redis not asked)
	NoPlan    int       `json:"no_plan"`  // recorded without a plan: replayed as the default plan
	CostFixed int       `json:"cost_inexact"`
	Elapsed   string    `json:"elapsed"`
	Total     Counts    `json:"total"`
	ByRule    []RuleRow `json:"by_rule"`
	ByPrio    []Row     `json:"by_priority"`
	ByPlan    []Row     `json:"by_plan"`
	ByKind    []Row     `json:"by_kind"`
	// TopPrincipals and TopPlans are the principals and the paying plans
	// whose outcomes the candidate changes most (new denials first).
	TopPrincipals []Affected `json:"top_principals"`
	TopPlans      []Affected `json:"top_paying_plans"`
	Verdict       string     `json:"verdict"` // safe, review or reject
	Reasons       []string   `json:"reasons"`
	// Confidence is high unless something about the recording or the
	// replay makes the counts less certain (Caveats says what).
	Confidence string   `json:"confidence"`
	Caveats    []string `json:"caveats"`

	tally *tally
	slow  string // why the replay's wall time may have cut buckets short
}

// Thresholds turn counts into a verdict.
type Thresholds struct {
	// RejectCritical: reject when the candidate blocks more than this share
	// of the CRITICAL traffic that was allowed as recorded (default 0.05).
	RejectCritical float64
	// Review: review when the candidate newly blocks more than this share of
	// the allowed traffic overall, of any priority, or of any paying plan
	// (default 0.01).
	Review float64
	// FreePlans are the plans that do not pay (default: default, free).
	FreePlans []string
}

func (t Thresholds) withDefaults() Thresholds {
	if t.RejectCritical <= 0 {
		t.RejectCritical = 0.05
	}
	if t.Review <= 0 {
		t.Review = 0.01
	}
	if t.FreePlans == nil {
		t.FreePlans = []string{"default", "free"}
	}
	return t
}

// Validate checks the thresholds' ranges.
func (t Thresholds) Validate() error {
	if t.RejectCritical < 0 || t.RejectCritical > 1 {
		return fmt.Errorf("reject-critical %g: want a share in [0, 1]", t.RejectCritical)
	}
	if t.Review < 0 || t.Review > 1 {
		return fmt.Errorf("review %g: want a share in [0, 1]", t.Review)
	}
	return nil
}

func share(n, of int) float64 {
	if of == 0 {
		return 0
	}
	return float64(n) / float64(of)
}

// judge sets Verdict, Reasons, Confidence and Caveats from the counts.
func (r *Report) judge(t Thresholds) {
	t = t.withDefaults()
	r.Verdict, r.Reasons, r.Confidence, r.Caveats = VerdictSafe, nil, "high", nil
	worst := func(v string) {
		if v == VerdictReject || r.Verdict == VerdictSafe {
			r.Verdict = v
		}
	}
	for _, row := range r.ByPrio {
		if row.Key != "critical" {
			continue
		}
		s := share(row.NewlyBlocked, row.AllowedRecorded())
		switch {
		case s > t.RejectCritical:
			worst(VerdictReject)
			r.Reasons = append(r.Reasons, fmt.Sprintf("blocks %.2f %% of the critical traffic that was allowed (%d of %d), over the %.2f %% limit",
				100*s, row.NewlyBlocked, row.AllowedRecorded(), 100*t.RejectCritical))
		case row.NewlyBlocked > 0:
			worst(VerdictReview)
			r.Reasons = append(r.Reasons, fmt.Sprintf("blocks %d critical requests that were allowed (%.2f %%)", row.NewlyBlocked, 100*s))
		}
	}
	if s := share(r.Total.NewlyBlocked, r.Total.AllowedRecorded()); s > t.Review {
		worst(VerdictReview)
		r.Reasons = append(r.Reasons, fmt.Sprintf("blocks %.2f %% of all allowed traffic (%d requests), over %.2f %%", 100*s, r.Total.NewlyBlocked, 100*t.Review))
	}
	for _, row := range r.ByPrio {
		if s := share(row.NewlyBlocked, row.AllowedRecorded()); row.Key != "critical" && s > t.Review {
			worst(VerdictReview)
			r.Reasons = append(r.Reasons, fmt.Sprintf("blocks %.2f %% of allowed %s traffic (%d requests)", 100*s, row.Key, row.NewlyBlocked))
		}
	}
	for _, row := range r.ByPlan {
		if slices.Contains(t.FreePlans, row.Key) {
			continue
		}
		if s := share(row.NewlyBlocked, row.AllowedRecorded()); s > t.Review {
			worst(VerdictReview)
			r.Reasons = append(r.Reasons, fmt.Sprintf("blocks %.2f %% of the paying plan %s's allowed traffic (%d requests)", 100*s, row.Key, row.NewlyBlocked))
		}
	}
	if r.Total.NewlyAllowed > 0 {
		r.Reasons = append(r.Reasons, fmt.Sprintf("allows %d requests that were blocked (%.2f %% of the blocked)",
			r.Total.NewlyAllowed, 100*share(r.Total.NewlyAllowed, r.Total.BlockedRecorded)))
	}

	caveat := func(format string, args ...any) {
		r.Caveats = append(r.Caveats, fmt.Sprintf(format, args...))
		r.Confidence = "low"
	}
	if r.Replayed == 0 {
		caveat("no decisions were recorded in the range")
	}
	if r.Read.Undecoded > 0 {
		caveat("%d messages in the range were not valid decision.v1 events and were skipped", r.Read.Undecoded)
	}
	if s := share(r.Degraded, r.Replayed); s > 0.01 {
		caveat("%.2f %% of the decisions were made under a fail policy (Redis not asked): what was blocked is not what the rules decided", 100*s)
	}
	if r.NoPlan > 0 {
		caveat("%d decisions carry no plan (recorded by a limiter before plans were recorded): replayed as the default plan", r.NoPlan)
	}
	if r.CostFixed > 0 {
		caveat("%d decisions' units are not a multiple of the route's cost in the baseline rules: their request cost was rounded", r.CostFixed)
	}
	if r.slow != "" {
		caveat("%s", r.slow)
	}
	if r.Baseline == "" {
		r.Caveats = append(r.Caveats, "no baseline rules: each request's cost was recovered with the candidate's route costs")
	}
	if s := share(r.Shed, r.Shed+r.Replayed); s > 0.01 {
		r.Caveats = append(r.Caveats, fmt.Sprintf("%.2f %% of the requests were shed by priority and not replayed", 100*s))
	}
	if r.Confidence == "low" && r.Verdict == VerdictSafe {
		r.Verdict = VerdictReview
		r.Reasons = append(r.Reasons, "the counts look safe but confidence is low (see caveats)")
	}
	if len(r.Reasons) == 0 {
		r.Reasons = append(r.Reasons, "blocks no critical traffic that was allowed and stays under every threshold")
	}
}

// tally accumulates a report.
type tally struct {
	total      Counts
	rules      map[string]*RuleRow
	prio, plan map[string]*Counts
	kind       map[string]*Counts
	principals map[string]*Affected
}

func newTally() *tally {
	return &tally{rules: map[string]*RuleRow{}, prio: map[string]*Counts{}, plan: map[string]*Counts{},
		kind: map[string]*Counts{}, principals: map[string]*Affected{}}
}

func counts(m map[string]*Counts, k string) *Counts {
	c := m[k]
	if c == nil {
		c = &Counts{}
		m[k] = c
	}
	return c
}

func (t *tally) rule(id string) *RuleRow {
	r := t.rules[id]
	if r == nil {
		r = &RuleRow{Rule: id}
		t.rules[id] = r
	}
	return r
}

// outcome is one replayed request.
type outcome struct {
	principal, kind, plan, prio string
	recordedBlocked             bool
	recordedRule                string // deciding rule as recorded ("" when none)
	candidateBlocked            bool
	candidateRule               string   // the candidate's deciding rule
	matched                     []string // candidate rules evaluated
	shadowBlocked               []string // candidate shadow rules that would deny
}

func (t *tally) add(o outcome) {
	t.total.add(o.recordedBlocked, o.candidateBlocked)
	counts(t.prio, o.prio).add(o.recordedBlocked, o.candidateBlocked)
	counts(t.plan, o.plan).add(o.recordedBlocked, o.candidateBlocked)
	counts(t.kind, o.kind).add(o.recordedBlocked, o.candidateBlocked)
	for _, id := range o.matched {
		t.rule(id).Matched++
	}
	for _, id := range o.shadowBlocked {
		t.rule(id).ShadowBlocked++
	}
	if o.recordedBlocked && o.recordedRule != "" {
		r := t.rule(o.recordedRule)
		r.BlockedRecorded++
		if !o.candidateBlocked {
			r.NewlyAllowed++
		}
	}
	if o.candidateBlocked && o.candidateRule != "" {
		r := t.rule(o.candidateRule)
		r.BlockedCandidate++
		if !o.recordedBlocked {
			r.NewlyBlocked++
		}
	}
	// Total per rule: the requests it decided on either side.
	if o.recordedRule != "" {
		t.rule(o.recordedRule).Total++
	}
	if o.candidateRule != "" && o.candidateRule != o.recordedRule {
		t.rule(o.candidateRule).Total++
	}
	if o.recordedBlocked != o.candidateBlocked {
		a := t.principals[o.principal]
		if a == nil {
			a = &Affected{Key: o.principal, Plan: o.plan}
			t.principals[o.principal] = a
		}
		if o.candidateBlocked {
			a.NewlyBlocked++
		} else {
			a.NewlyAllowed++
		}
	}
}

func rows(m map[string]*Counts, order []string) []Row {
	out := make([]Row, 0, len(m))
	for k, c := range m {
		out = append(out, Row{Key: k, Counts: *c})
	}
	rank := func(k string) int {
		if i := slices.Index(order, k); i >= 0 {
			return i
		}
		return len(order)
	}
	slices.SortFunc(out, func(a, b Row) int {
		return cmp.Or(cmp.Compare(rank(a.Key), rank(b.Key)), cmp.Compare(a.Key, b.Key))
	})
	return out
}

func byChange(a, b Affected) int {
	return cmp.Or(cmp.Compare(b.NewlyBlocked, a.NewlyBlocked), cmp.Compare(b.NewlyAllowed, a.NewlyAllowed), cmp.Compare(a.Key, b.Key))
}

// finish turns the tally into the report's rows (candidate is the
// candidate's rule ids, in file order) and judges it.
func (t *tally) finish(r *Report, candidate []string, top int, th Thresholds) {
	th = th.withDefaults()
	r.Total = t.total
	for _, id := range candidate {
		t.rule(id).InCandidate = true
	}
	r.ByRule = r.ByRule[:0]
	for _, id := range candidate {
		r.ByRule = append(r.ByRule, *t.rules[id])
	}
	var gone []string
	for id := range t.rules {
		if !slices.Contains(candidate, id) {
			gone = append(gone, id)
		}
	}
	slices.Sort(gone)
	for _, id := range gone {
		r.ByRule = append(r.ByRule, *t.rules[id])
	}
	r.ByPrio = rows(t.prio, []string{"critical", "degraded", "best_effort", "bulk"})
	r.ByPlan = rows(t.plan, nil)
	r.ByKind = rows(t.kind, []string{"user", "bot", "api_key", "anonymous"})
	r.TopPrincipals = r.TopPrincipals[:0]
	for _, a := range t.principals {
		r.TopPrincipals = append(r.TopPrincipals, *a)
	}
	slices.SortFunc(r.TopPrincipals, byChange)
	if len(r.TopPrincipals) > top {
		r.TopPrincipals = r.TopPrincipals[:top]
	}
	r.TopPlans = r.TopPlans[:0]
	for _, row := range r.ByPlan {
		if slices.Contains(th.FreePlans, row.Key) || (row.NewlyBlocked == 0 && row.NewlyAllowed == 0) {
			continue
		}
		r.TopPlans = append(r.TopPlans, Affected{Key: row.Key, Total: row.Total, NewlyBlocked: row.NewlyBlocked, NewlyAllowed: row.NewlyAllowed})
	}
	slices.SortFunc(r.TopPlans, byChange)
	if len(r.TopPlans) > top {
		r.TopPlans = r.TopPlans[:top]
	}
	r.judge(th)
}

// WriteJSON writes the report as one indented JSON document.
func (r *Report) WriteJSON(w io.Writer) error {
	enc := json.NewEncoder(w)
	enc.SetIndent("", "  ")
	return enc.Encode(r)
}

// WriteText writes the report for a terminal.
func (r *Report) WriteText(w io.Writer) error {
	var b strings.Builder
	fmt.Fprintf(&b, "what-if %s", r.Rules)
	if r.Baseline != "" {
		fmt.Fprintf(&b, " (baseline %s)", r.Baseline)
	}
	fmt.Fprintf(&b, " on %s [%s, %s)\n", r.Topic, r.From.Format(time.RFC3339), r.To.Format(time.RFC3339))
	fmt.Fprintf(&b, "verdict: %s (confidence %s)\n", strings.ToUpper(r.Verdict), r.Confidence)
	for _, s := range r.Reasons {
		fmt.Fprintf(&b, "  - %s\n", s)
	}
	for _, s := range r.Caveats {
		fmt.Fprintf(&b, "  caveat: %s\n", s)
	}
	fmt.Fprintf(&b, "replayed %d decisions in %s (scanned %d, shed %d, envoy-configured %d, degraded %d, undecodable %d)\n\n",
		r.Replayed, r.Elapsed, r.Read.Scanned, r.Shed, r.Envoy, r.Degraded, r.Read.Undecoded)
	tw := tabwriter.NewWriter(&b, 0, 0, 2, ' ', tabwriter.AlignRight)
	head := "\ttotal\tblocked (recorded)\tblocked (candidate)\tnewly blocked\tnewly allowed\t\n"
	line := func(k string, c Counts, extra string) {
		if extra != "" {
			extra = "  " + extra
		}
		fmt.Fprintf(tw, "%s\t%d\t%d\t%d\t%d\t%d\t%s\n", k, c.Total, c.BlockedRecorded, c.BlockedCandidate, c.NewlyBlocked, c.NewlyAllowed, extra)
	}
	fmt.Fprint(tw, "rule"+head)
	for _, row := range r.ByRule {
		extra := fmt.Sprintf("matched %d", row.Matched)
		if row.ShadowBlocked > 0 {
			extra += fmt.Sprintf(", shadow would block %d", row.ShadowBlocked)
		}
		if !row.InCandidate {
			extra = "not in the candidate"
		}
		line(row.Rule, row.Counts, extra)
	}
	line("all", r.Total, "")
	for _, dim := range []struct {
		name string
		rows []Row
	}{{"priority", r.ByPrio}, {"plan", r.ByPlan}, {"kind", r.ByKind}} {
		fmt.Fprint(tw, "\t\t\t\t\t\t\n"+dim.name+head)
		for _, row := range dim.rows {
			line(row.Key, row.Counts, "")
		}
	}
	if err := tw.Flush(); err != nil {
		return err
	}
	for _, top := range []struct {
		name string
		list []Affected
	}{{"principals most affected", r.TopPrincipals}, {"paying plans most affected", r.TopPlans}} {
		fmt.Fprintf(&b, "\n%s:\n", top.name)
		if len(top.list) == 0 {
			b.WriteString("  none\n")
		}
		for _, a := range top.list {
			fmt.Fprintf(&b, "  %s", a.Key)
			if a.Plan != "" {
				fmt.Fprintf(&b, " (plan %s)", a.Plan)
			}
			fmt.Fprintf(&b, ": newly blocked %d, newly allowed %d\n", a.NewlyBlocked, a.NewlyAllowed)
		}
	}
	_, err := io.WriteString(w, b.String())
	return err
}
