package envoyconf

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"path/filepath"
	"sort"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// Source is a configuration directory kept loaded (config.Reloadable): an
// invalid edit keeps the previous configuration. Safe for concurrent use.
type Source struct {
	dir  string
	log  *slog.Logger
	file *config.Reloadable[Config]
}

// OpenDir loads dir (every *.yaml / *.yml); an invalid directory is an error
// naming the file and line.
func OpenDir(dir string, o Options, log *slog.Logger) (*Source, error) {
	file, err := config.LoadReloadable(func() ([]byte, error) { return dirContent(dir) },
		func([]byte) (*Config, error) { return LoadDir(dir, o) })
	if err != nil {
		return nil, err
	}
	return &Source{dir: dir, log: log, file: file}, nil
}

// Config is the configuration in force.
func (s *Source) Config() *Config { return s.file.Current() }

// Reload re-reads the directory; it reports whether the configuration was
// replaced. On error the previous configuration stays.
func (s *Source) Reload() (bool, error) { return s.file.Reload(false) }

// Run reloads every poll interval and on every value from hup until ctx is
// done; failed reloads are logged and keep the configuration in force.
func (s *Source) Run(ctx context.Context, poll time.Duration, hup <-chan os.Signal) error {
	return s.file.Run(ctx, poll, hup, func(_ bool, err error) {
		if err != nil {
			s.log.Error("reload envoy ratelimit configuration; keeping the previous one", "dir", s.dir, "err", err)
			return
		}
		s.log.Info("envoy ratelimit configuration reloaded", "dir", s.dir, "domains", s.Config().Domains())
	})
}

// dirContent is the names and contents of the directory's YAML files, for
// telling an edit from an unchanged poll.
func dirContent(dir string) ([]byte, error) {
	entries, err := os.ReadDir(dir)
	if err != nil {
		return nil, err
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
			return nil, err
		}
		buf.WriteString(n)
		buf.WriteByte(0)
		buf.Write(b)
		buf.WriteByte(0)
	}
	return buf.Bytes(), nil
}
