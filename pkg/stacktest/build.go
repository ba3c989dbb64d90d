package stacktest

import (
	"os/exec"
	"path/filepath"
	"runtime"
	"testing"
)

// Root is the directory of this module (the repository's root), wherever
// the test runs from.
func Root(t testing.TB) string {
	t.Helper()
	_, self, _, ok := runtime.Caller(0)
	if !ok {
		t.Fatal("no caller information to find the module's root")
	}
	return filepath.Clean(filepath.Join(filepath.Dir(self), "..", ".."))
}

// GoBuild builds the named services (./services/<name> of this module)
// into dir, one binary each named after its service; out is go build's
// output. For binaries shared by a whole test binary (built once, in
// TestMain's directory); a single test calls Build.
func GoBuild(dir string, names ...string) (out []byte, err error) {
	_, self, _, _ := runtime.Caller(0)
	args := []string{"build", "-o", dir + string(filepath.Separator)}
	for _, n := range names {
		args = append(args, "./services/"+n)
	}
	cmd := exec.Command("go", args...)
	cmd.Dir = filepath.Join(filepath.Dir(self), "..", "..")
	return cmd.CombinedOutput()
}

// Build builds the named services into a directory of the test's own and
// returns it; a build that fails fails the test with go build's output.
func Build(t testing.TB, names ...string) string {
	t.Helper()
	dir := t.TempDir()
	if out, err := GoBuild(dir, names...); err != nil {
		t.Fatalf("go build: %v\n%s", err, out)
	}
	return dir
}
