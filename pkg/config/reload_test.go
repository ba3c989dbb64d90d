package config

import (
	"context"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"
)

func parseInt(b []byte) (*int, error) {
	n, err := strconv.Atoi(strings.TrimSpace(string(b)))
	if err != nil {
		return nil, err
	}
	return &n, nil
}

func TestReloadableKeepsTheValueOnAnInvalidChange(t *testing.T) {
	path := filepath.Join(t.TempDir(), "n")
	write := func(s string) {
		if err := os.WriteFile(path, []byte(s), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	write("1")
	r, err := LoadReloadable(func() ([]byte, error) { return os.ReadFile(path) }, parseInt)
	if err != nil || *r.Current() != 1 {
		t.Fatalf("load: %v", err)
	}
	if replaced, err := r.Reload(false); replaced || err != nil {
		t.Fatalf("unchanged content: replaced=%v err=%v", replaced, err)
	}
	write("2")
	if replaced, err := r.Reload(false); !replaced || err != nil || *r.Current() != 2 {
		t.Fatalf("valid change: replaced=%v err=%v value=%d", replaced, err, *r.Current())
	}
	write("two")
	if _, err := r.Reload(false); err == nil || *r.Current() != 2 {
		t.Fatalf("invalid change: err=%v value=%d", err, *r.Current())
	}
	if replaced, err := r.Reload(false); replaced || err != nil {
		t.Fatalf("the same invalid content is reported once per change, got replaced=%v err=%v", replaced, err)
	}
	if _, err := r.Reload(true); err == nil {
		t.Fatal("a forced reload parses the invalid content again")
	}
	if err := os.Remove(path); err != nil {
		t.Fatal(err)
	}
	if _, err := r.Reload(false); !errors.Is(err, os.ErrNotExist) || *r.Current() != 2 {
		t.Fatalf("vanished file: err=%v value=%d", err, *r.Current())
	}
	if _, err := LoadReloadable(func() ([]byte, error) { return []byte("x"), nil }, parseInt); err == nil {
		t.Fatal("invalid content at start-up is an error")
	}
}

func TestReloadableRunPollsAndReloadsOnSignal(t *testing.T) {
	content := []byte("1")
	reads := make(chan struct{}, 100)
	read := func() ([]byte, error) { reads <- struct{}{}; return content, nil }
	r, err := LoadReloadable(read, parseInt)
	if err != nil {
		t.Fatal(err)
	}
	<-reads
	signals := make(chan os.Signal, 1)
	reports := make(chan bool, 10)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error)
	go func() {
		done <- r.Run(ctx, time.Hour, signals, func(replaced bool, err error) {
			if err != nil {
				t.Errorf("report: %v", err)
			}
			reports <- replaced
		})
	}()
	signals <- syscall.SIGHUP // unchanged content, forced: parsed and reported
	select {
	case replaced := <-reports:
		if !replaced {
			t.Fatal("a forced reload reports the value replaced")
		}
	case <-time.After(10 * time.Second):
		t.Fatal("no reload on the signal")
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
}
