package limiter

import (
	"context"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// RuleStore holds the rules in force. Safe for concurrent use.
type RuleStore struct {
	cur  atomic.Pointer[Ruleset]
	cand atomic.Pointer[Candidate] // a rules version in shadow (candidate.go)
}

var _ RuleSource = (*RuleStore)(nil)

// NewRuleStore returns a store holding rs.
func NewRuleStore(rs *Ruleset) *RuleStore {
	s := &RuleStore{}
	s.cur.Store(rs)
	return s
}

// Rules returns the current rules.
func (s *RuleStore) Rules() *Ruleset { return s.cur.Load() }

// Set replaces the rules.
func (s *RuleStore) Set(rs *Ruleset) { s.cur.Store(rs) }

// LoadRulesFile reads and validates a rules file.
func LoadRulesFile(path string) (*Ruleset, []byte, error) {
	data, err := os.ReadFile(path)
	if err != nil {
		return nil, nil, fmt.Errorf("read rules: %w", err)
	}
	rs, err := ParseRules(path, data)
	return rs, data, err
}

// Reloader re-reads a rules file when its content changes (polled) or when a
// signal arrives on Reload (SIGHUP), keeping the old rules when the new file is
// invalid (config.Reloadable), and puts the rules in force into Store.
type Reloader struct {
	Path   string
	Store  *RuleStore
	Every  time.Duration    // content poll interval
	Reload <-chan os.Signal // e.g. signal.Notify(ch, syscall.SIGHUP); may be nil
	Log    *slog.Logger

	file    *config.Reloadable[Ruleset]
	reloads *prometheus.CounterVec
	// Applied, when set, is called after every reload attempt (tests wait on it).
	Applied func(err error)
}

// NewReloader returns a reloader whose last-seen content is data (the file the
// store was loaded from).
func NewReloader(path string, data []byte, store *RuleStore, every time.Duration, reload <-chan os.Signal, log *slog.Logger, reg prometheus.Registerer) *Reloader {
	read := func() ([]byte, error) {
		b, err := os.ReadFile(path)
		if err != nil {
			return nil, fmt.Errorf("read rules: %w", err)
		}
		return b, nil
	}
	parse := func(b []byte) (*Ruleset, error) { return ParseRules(path, b) }
	return &Reloader{Path: path, Store: store, Every: every, Reload: reload, Log: log,
		file:    config.NewReloadable(data, store.Rules(), read, parse),
		reloads: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_rules_reloads_total", Help: "Rules file reloads by result (applied, rejected)."}, []string{"result"})}
}

// Run polls until ctx is done.
func (r *Reloader) Run(ctx context.Context) error {
	return r.file.Run(ctx, r.Every, r.Reload, func(_ bool, err error) {
		if err != nil {
			r.reloads.WithLabelValues("rejected").Inc()
			r.Log.Error("rules rejected; keeping the previous rules", "path", r.Path, "err", err)
		} else {
			rs := r.file.Current()
			r.Store.Set(rs)
			r.reloads.WithLabelValues("applied").Inc()
			r.Log.Info("rules applied", "path", r.Path, "rules", len(rs.Rules), "quotas", len(rs.Quotas), "shadow", rs.Shadow)
		}
		if r.Applied != nil {
			r.Applied(err)
		}
	})
}
