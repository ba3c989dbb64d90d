package stacktest

import (
	"context"
	"errors"
	"log/slog"
	"testing"
	"time"
)

// Service is a service's Run started in the test's own process, its log
// captured.
type Service struct {
	// Log holds the service's log lines.
	Log    *Log
	t      testing.TB
	cancel context.CancelFunc
	done   chan error
	err    error
	exited bool
}

// StopTimeout is how long Stop and the end of the test wait for a service
// to return after its context is cancelled.
const StopTimeout = 30 * time.Second

// Start runs run in a goroutine with a logger writing into the service's
// Log (debug level, so that tests can look for any line), until Stop or the
// end of the test. At the end of a failed test the log is written to the
// test's output.
func Start(t testing.TB, name string, run func(ctx context.Context, log *slog.Logger) error) *Service {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	s := &Service{Log: &Log{}, t: t, cancel: cancel, done: make(chan error, 1)}
	log := s.Log.Logger(slog.LevelDebug)
	go func() { s.done <- run(ctx, log) }()
	t.Cleanup(func() {
		_ = s.Stop() // a test that cares about the exit calls Stop itself
		if t.Failed() {
			t.Logf("%s log:\n%s", name, s.Log.String())
		}
	})
	return s
}

// Stop cancels the service's context and returns what its Run returned; a
// service that does not return within StopTimeout fails the test. Calling
// Stop again returns the same answer.
func (s *Service) Stop() error {
	if !s.exited {
		s.cancel()
	}
	return s.Wait(StopTimeout)
}

// Exited reports, without waiting, whether Run has returned, and what it
// returned: a test polling for an effect stops early when the service died.
func (s *Service) Exited() (bool, error) {
	if s.exited {
		return true, s.err
	}
	select {
	case s.err = <-s.done:
		s.exited = true
		return true, s.err
	default:
		return false, nil
	}
}

// Wait returns what Run returned by itself — a service that refuses its
// configuration at start-up — failing the test when Run is still running
// after timeout.
func (s *Service) Wait(timeout time.Duration) error {
	if s.exited {
		return s.err
	}
	select {
	case s.err = <-s.done:
	case <-time.After(timeout):
		s.t.Errorf("service did not return within %s", timeout)
		s.err = errors.New("service did not return")
	}
	s.exited = true
	return s.err
}
