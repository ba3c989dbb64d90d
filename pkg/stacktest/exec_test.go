package stacktest_test

import (
	"errors"
	"fmt"
	"net/http"
	"net/http/httptest"
	"net/url"
	"os"
	"path/filepath"
	"runtime"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// recorder is a test that keeps its cleanups, errors and log lines for the
// test that checks them.
type recorder struct {
	testing.TB
	cleanups []func()
	errs     []string
	logs     []string
}

func (r *recorder) Helper()          {}
func (r *recorder) Cleanup(f func()) { r.cleanups = append(r.cleanups, f) }
func (r *recorder) Errorf(format string, a ...any) {
	r.errs = append(r.errs, fmt.Sprintf(format, a...))
}
func (r *recorder) Logf(format string, a ...any) { r.logs = append(r.logs, fmt.Sprintf(format, a...)) }
func (r *recorder) Failed() bool                 { return len(r.errs) > 0 }
func (r *recorder) Fatalf(format string, a ...any) {
	r.Errorf(format, a...)
	runtime.Goexit()
}
func (r *recorder) end() {
	for i := len(r.cleanups) - 1; i >= 0; i-- {
		r.cleanups[i]()
	}
}

// loop is a shell that prints what it is given, then waits; on SIGINT it
// exits with code.
func loop(code int) []string {
	return []string{"-c", fmt.Sprintf(`echo "$GREETING"; trap "exit %d" INT; while :; do sleep 0.05; done`, code)}
}

func TestExecInterruptsTheProcessAtTheEnd(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	logs := stacktest.Exec(r, "/bin/sh", []string{"GREETING=hello from the child"}, loop(0)...)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "hello from the child") }, 5*time.Second, 10*time.Millisecond,
		"env is added, output goes to the log")
	r.end()
	require.Empty(t, r.errs, "exit 0 on the interrupt")
	require.Empty(t, r.logs, "the log is written only when the test failed")
}

func TestExecFailsTheTestWhenTheProcessExitsWithAnError(t *testing.T) {
	t.Parallel()
	r := &recorder{TB: t}
	logs := stacktest.Exec(r, "/bin/sh", []string{"GREETING=about to fail"}, loop(3)...)
	require.Eventually(t, func() bool { return strings.Contains(logs.String(), "about to fail") }, 5*time.Second, 10*time.Millisecond)
	r.end()
	require.Equal(t, []string{"sh exited with exit status 3"}, r.errs)
	require.Len(t, r.logs, 1)
	require.Contains(t, r.logs[0], "sh log:\nabout to fail")
}

func TestRootIsTheModule(t *testing.T) {
	t.Parallel()
	b, err := os.ReadFile(filepath.Join(stacktest.Root(t), "go.mod"))
	require.NoError(t, err)
	require.Contains(t, string(b), "module github.com/floodgate-dev/floodgate\n")
}

func TestGoBuildSaysWhatFailed(t *testing.T) {
	t.Parallel()
	out, err := stacktest.GoBuild(t.TempDir(), "no-such-service")
	require.Error(t, err)
	require.Contains(t, string(out), "services/no-such-service")
}

func TestPostAsSendsThePrincipal(t *testing.T) {
	t.Parallel()
	var seen []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		seen = append(seen, r.Method+" "+r.URL.Path+" "+r.Header.Get("X-Principal-Kind")+":"+r.Header.Get("X-Principal-Id"))
		if len(seen) > 2 {
			w.Header().Set("Retry-After", "20")
			w.WriteHeader(http.StatusTooManyRequests)
		}
	}))
	defer srv.Close()
	codes, last := stacktest.PostAs(t, srv.URL+"/channels/7/messages", "bot", "b1", 3)
	require.Equal(t, []int{200, 200, 429}, codes)
	require.Equal(t, "20", last.Header.Get("Retry-After"))
	require.Equal(t, []string{"POST /channels/7/messages bot:b1", "POST /channels/7/messages bot:b1", "POST /channels/7/messages bot:b1"}, seen)
}

func TestReturnedFailsOnAnErrorOrNothing(t *testing.T) {
	t.Parallel()
	run := func(done chan error) []string {
		r := &recorder{TB: t}
		ended := make(chan struct{})
		go func() {
			defer close(ended)
			stacktest.Returned(r, done, 50*time.Millisecond, "the %s stops", "server")
		}()
		<-ended
		return r.errs
	}
	ok := make(chan error, 1)
	ok <- nil
	require.Empty(t, run(ok))
	failed := make(chan error, 1)
	failed <- errors.New("drain: 3 in flight")
	require.Equal(t, []string{"the server stops: returned drain: 3 in flight"}, run(failed))
	require.Equal(t, []string{"the server stops: nothing returned within 50ms"}, run(make(chan error)))
}

func TestGetAndPostFormReadTheBody(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost {
			_ = r.ParseForm()
			w.Header().Set("Location", "/done")
			w.WriteHeader(http.StatusSeeOther)
			_, _ = w.Write([]byte("posted " + r.PostForm.Get("csrf")))
			return
		}
		w.WriteHeader(http.StatusTeapot)
		_, _ = w.Write([]byte("page " + r.URL.Path))
	}))
	defer srv.Close()
	c := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	code, body := stacktest.Get(t, c, srv.URL+"/login")
	require.Equal(t, http.StatusTeapot, code)
	require.Equal(t, "page /login", body)
	res, body := stacktest.PostForm(t, c, srv.URL+"/login", url.Values{"csrf": {"tok"}})
	require.Equal(t, http.StatusSeeOther, res.StatusCode)
	require.Equal(t, "/done", res.Header.Get("Location"))
	require.Equal(t, "posted tok", body)
}
