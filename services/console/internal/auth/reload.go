package auth

import (
	"bytes"
	"context"
	"log/slog"
	"os"
	"sync/atomic"
	"time"
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
// invalid edit keeps the previous directory (and is logged).
type ReloadingDirectory struct {
	path string
	cur  atomic.Pointer[Directory]
	raw  []byte
	log  *slog.Logger
}

// LoadReloading reads path once; Run watches it.
func LoadReloading(path string, log *slog.Logger) (*ReloadingDirectory, error) {
	raw, err := os.ReadFile(path)
	if err != nil {
		return nil, err
	}
	d, err := Parse(raw)
	if err != nil {
		return nil, err
	}
	r := &ReloadingDirectory{path: path, raw: raw, log: log}
	r.cur.Store(d)
	return r, nil
}

// Password implements Users.
func (r *ReloadingDirectory) Password(name, password string) (Identity, bool) {
	return r.cur.Load().Password(name, password)
}

// Token implements Users.
func (r *ReloadingDirectory) Token(token string) (Identity, bool) { return r.cur.Load().Token(token) }

// User implements Users.
func (r *ReloadingDirectory) User(name string) (Identity, bool) { return r.cur.Load().User(name) }

// Reload re-reads the file now; it reports whether the directory changed.
func (r *ReloadingDirectory) Reload() (bool, error) {
	raw, err := os.ReadFile(r.path)
	if err != nil {
		return false, err
	}
	if bytes.Equal(raw, r.raw) {
		return false, nil
	}
	d, err := Parse(raw)
	if err != nil {
		return false, err
	}
	r.raw = raw
	r.cur.Store(d)
	return true, nil
}

// Run re-reads the file every interval until ctx is done.
func (r *ReloadingDirectory) Run(ctx context.Context, every time.Duration) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			changed, err := r.Reload()
			switch {
			case err != nil:
				r.log.Error("reload users file; keeping the previous users", "path", r.path, "err", err)
			case changed:
				r.log.Info("users file reloaded", "path", r.path)
			}
		}
	}
}
