package auth

import (
	"context"
	"log/slog"
	"os"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// Users is what the console asks of its users directory. *Directory and
// *ReloadingDirectory implement it; both are safe for concurrent use.
type Users interface {
	Password(name, password string) (Identity, bool)
	Token(token string) (Identity, bool)
	User(name string) (Identity, bool)
}

var (
	_ Users = (*Directory)(nil)
	_ Users = (*ReloadingDirectory)(nil)
)

// ReloadingDirectory is the users file, re-read when it changes, so removing
// a user or changing a role takes effect on the user's next request. An
// invalid edit keeps the previous directory (and is logged once).
type ReloadingDirectory struct {
	path string
	log  *slog.Logger
	file *config.Reloadable[Directory]
}

// LoadReloading reads path once; Run watches it.
func LoadReloading(path string, log *slog.Logger) (*ReloadingDirectory, error) {
	file, err := config.LoadReloadable(func() ([]byte, error) { return os.ReadFile(path) }, Parse)
	if err != nil {
		return nil, err
	}
	r := &ReloadingDirectory{path: path, log: log, file: file}
	r.warnLegacy()
	return r, nil
}

func (r *ReloadingDirectory) warnLegacy() {
	if r.file.Current().LegacyTokens() && r.log != nil {
		r.log.Warn("FLOODGATE_CONSOLE_USERS: tokens written as {name, role, sha256} are deprecated and will not be read after the next release; write \"name:role:sha256hex\" (docs/console.md)", "path", r.path)
	}
}

// Password implements Users.
func (r *ReloadingDirectory) Password(name, password string) (Identity, bool) {
	return r.file.Current().Password(name, password)
}

// Token implements Users.
func (r *ReloadingDirectory) Token(token string) (Identity, bool) {
	return r.file.Current().Token(token)
}

// User implements Users.
func (r *ReloadingDirectory) User(name string) (Identity, bool) { return r.file.Current().User(name) }

// Reload re-reads the file now; it reports whether the directory changed.
func (r *ReloadingDirectory) Reload() (bool, error) { return r.file.Reload(false) }

// Run re-reads the file every interval until ctx is done.
func (r *ReloadingDirectory) Run(ctx context.Context, every time.Duration) error {
	return r.file.Run(ctx, every, nil, func(_ bool, err error) {
		if err != nil {
			r.log.Error("reload users file; keeping the previous users", "path", r.path, "err", err)
			return
		}
		r.log.Info("users file reloaded", "path", r.path)
		r.warnLegacy()
	})
}
