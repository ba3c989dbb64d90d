package limiter

import (
	"bytes"
	"context"
	"crypto/sha256"
	"fmt"
	"log/slog"
	"os"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promauto"
)

// RuleStore holds the rules in force. Safe for concurrent use.
type RuleStore struct{ cur atomic.Pointer[Ruleset] }

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
// invalid.
type Reloader struct {
	Path   string
	Store  *RuleStore
	Every  time.Duration    // content poll interval
	Reload <-chan os.Signal // e.g. signal.Notify(ch, syscall.SIGHUP); may be nil
	Log    *slog.Logger

	sum     [32]byte
	reloads *prometheus.CounterVec
	// Applied, when set, is called after every reload attempt (tests wait on it).
	Applied func(err error)
}

// NewReloader returns a reloader whose last-seen content is data (the file the
// store was loaded from).
func NewReloader(path string, data []byte, store *RuleStore, every time.Duration, reload <-chan os.Signal, log *slog.Logger, reg prometheus.Registerer) *Reloader {
	return &Reloader{Path: path, Store: store, Every: every, Reload: reload, Log: log, sum: sha256.Sum256(data),
		reloads: promauto.With(reg).NewCounterVec(prometheus.CounterOpts{Name: "floodgate_limiter_rules_reloads_total", Help: "Rules file reloads by result (applied, rejected)."}, []string{"result"})}
}

// Run polls until ctx is done.
func (r *Reloader) Run(ctx context.Context) error {
	t := time.NewTicker(r.Every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			r.check(false)
		case <-r.Reload:
			r.Log.Info("reloading rules on signal", "path", r.Path)
			r.check(true)
		}
	}
}

func (r *Reloader) check(force bool) {
	data, err := os.ReadFile(r.Path)
	if err != nil {
		r.done(fmt.Errorf("read rules: %w", err))
		return
	}
	sum := sha256.Sum256(data)
	if !force && bytes.Equal(sum[:], r.sum[:]) {
		return
	}
	r.sum = sum // a bad file is reported once per change, not once per poll
	rs, err := ParseRules(r.Path, data)
	if err != nil {
		r.done(err)
		return
	}
	r.Store.Set(rs)
	r.done(nil)
}

func (r *Reloader) done(err error) {
	if err != nil {
		r.reloads.WithLabelValues("rejected").Inc()
		r.Log.Error("rules rejected; keeping the previous rules", "path", r.Path, "err", err)
	} else {
		r.reloads.WithLabelValues("applied").Inc()
		rs := r.Store.Rules()
		r.Log.Info("rules applied", "path", r.Path, "rules", len(rs.Rules), "quotas", len(rs.Quotas), "shadow", rs.Shadow)
	}
	if r.Applied != nil {
		r.Applied(err)
	}
}
