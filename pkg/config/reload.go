package config

import (
	"context"
	"crypto/sha256"
	"os"
	"sync/atomic"
	"time"
)

// Reloadable is a value parsed from files and kept in force while they
// change: Reload re-reads the content and parses it when it changed; an
// invalid change keeps the previous value and is reported once, not on every
// poll. Current is safe for concurrent use; Reload and Run belong to one
// goroutine.
type Reloadable[T any] struct {
	read  func() ([]byte, error)
	parse func([]byte) (*T, error)
	cur   atomic.Pointer[T]
	sum   [32]byte
}

// LoadReloadable reads and parses the content once; an error is a start-up
// error.
func LoadReloadable[T any](read func() ([]byte, error), parse func([]byte) (*T, error)) (*Reloadable[T], error) {
	content, err := read()
	if err != nil {
		return nil, err
	}
	v, err := parse(content)
	if err != nil {
		return nil, err
	}
	return NewReloadable(content, v, read, parse), nil
}

// NewReloadable returns a Reloadable holding v, which the caller parsed from
// content at start-up.
func NewReloadable[T any](content []byte, v *T, read func() ([]byte, error), parse func([]byte) (*T, error)) *Reloadable[T] {
	r := &Reloadable[T]{read: read, parse: parse, sum: sha256.Sum256(content)}
	r.cur.Store(v)
	return r
}

// Current is the value in force.
func (r *Reloadable[T]) Current() *T { return r.cur.Load() }

// Reload re-reads the content and reports whether the value was replaced;
// force parses it even when unchanged. On error the previous value stays.
func (r *Reloadable[T]) Reload(force bool) (bool, error) {
	content, err := r.read()
	if err != nil {
		return false, err
	}
	sum := sha256.Sum256(content)
	if !force && sum == r.sum {
		return false, nil
	}
	r.sum = sum // an invalid change is reported once per change, not once per poll
	v, err := r.parse(content)
	if err != nil {
		return false, err
	}
	r.cur.Store(v)
	return true, nil
}

// Run reloads every interval, and forced on every value from signals (nil:
// none, e.g. SIGHUP through signal.Notify), until ctx is done. Every attempt
// that replaced the value or failed is passed to report.
func (r *Reloadable[T]) Run(ctx context.Context, every time.Duration, signals <-chan os.Signal, report func(replaced bool, err error)) error {
	t := time.NewTicker(every)
	defer t.Stop()
	for {
		force := false
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-signals:
			force = true
		}
		if replaced, err := r.Reload(force); replaced || err != nil {
			report(replaced, err)
		}
	}
}
