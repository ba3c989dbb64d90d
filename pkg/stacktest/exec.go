package stacktest

import (
	"os"
	"os/exec"
	"path/filepath"
	"testing"
	"time"
)

// ExecStopTimeout is how long Exec waits at the end of the test for a
// process to drain and exit after its interrupt, before it kills it.
const ExecStopTimeout = 20 * time.Second

// Exec runs the binary at path with args, env added to this process's
// environment, until the test ends: then an interrupt, and a kill after
// ExecStopTimeout. A process that exits with an error, or has to be killed,
// fails the test (a service drains and exits 0 on SIGINT). Its stdout and
// stderr go to the returned Log, which is written to the test's output when
// the test failed.
func Exec(t testing.TB, path string, env []string, args ...string) *Log {
	t.Helper()
	logs := &Log{}
	name := filepath.Base(path)
	cmd := exec.Command(path, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = logs, logs
	if err := cmd.Start(); err != nil {
		t.Fatalf("start %s: %v", path, err)
	}
	t.Cleanup(func() {
		_ = cmd.Process.Signal(os.Interrupt)
		done := make(chan error, 1)
		go func() { done <- cmd.Wait() }()
		select {
		case err := <-done:
			if err != nil {
				t.Errorf("%s exited with %v", name, err)
			}
		case <-time.After(ExecStopTimeout):
			_ = cmd.Process.Kill()
			t.Errorf("%s did not drain within %s: %v", name, ExecStopTimeout, <-done)
		}
		if t.Failed() {
			t.Logf("%s log:\n%s", name, logs.String())
		}
	})
	return logs
}
