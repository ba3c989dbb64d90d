package envoyconf

import (
	"bytes"
	"context"
	"crypto/sha256"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"sync/atomic"
	"time"
)

// Source is a configuration directory kept loaded: Reload re-reads it, an
// invalid edit keeps the previous configuration. Safe for concurrent use.
type Source struct {
	dir  string
	opts Options
	log  *slog.Logger
	cur  atomic.Pointer[Config]
	sum  [32]byte
}

// OpenDir loads dir (every *.yaml / *.yml); an invalid directory is an error
// naming the file and line.
func OpenDir(dir string, o Options, log *slog.Logger) (*Source, error) {
	s := &Source{dir: dir, opts: o, log: log}
	if _, err := s.Reload(); err != nil {
		return nil, err
	}
	return s, nil
}

// Config is the configuration in force.
func (s *Source) Config() *Config { return s.cur.Load() }

// Reload re-reads the directory; it reports whether the configuration
// changed. On error the previous configuration stays.
func (s *Source) Reload() (bool, error) {
	sum, err := dirSum(s.dir)
	if err != nil {
		return false, err
	}
	if s.cur.Load() != nil && sum == s.sum {
		return false, nil
	}
	c, err := LoadDir(s.dir, s.opts)
	if err != nil {
		return false, err
	}
	s.cur.Store(c)
	s.sum = sum
	return true, nil
}

// Run reloads every poll interval and on every value from hup until ctx is
// done; failed reloads are logged and keep the configuration in force.
func (s *Source) Run(ctx context.Context, poll time.Duration, hup <-chan os.Signal) error {
	t := time.NewTicker(poll)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-hup:
		}
		changed, err := s.Reload()
		switch {
		case err != nil:
			s.log.Error("reload envoy ratelimit configuration; keeping the previous one", "dir", s.dir, "err", err)
		case changed:
			s.log.Info("envoy ratelimit configuration reloaded", "dir", s.dir, "domains", s.Config().Domains())
		}
	}
}

// dirSum hashes the names and contents of the directory's YAML files.
func dirSum(dir string) ([32]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return [32]byte{}, err
	}
	var names []string
	for _, e := range entries {
		n := e.Name()
		if !e.IsDir() && (filepath.Ext(n) == ".yaml" || filepath.Ext(n) == ".yml") {
			names = append(names, n)
		}
	}
	sort.Strings(names)
	var buf bytes.Buffer
	for _, n := range names {
		b, err := os.ReadFile(filepath.Join(dir, n))
		if err != nil {
			return [32]byte{}, err
		}
		buf.WriteString(n)
		buf.WriteByte(0)
		buf.Write(b)
		buf.WriteByte(0)
	}
	return sha256.Sum256(buf.Bytes()), nil
}
