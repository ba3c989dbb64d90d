package main

import (
	"context"
	"fmt"
	"net/http"
	"net/http/cookiejar"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest/browsertest"
)

// TestDemoTraffic runs the demo — the real limiter, detector, quota,
// adjuster, dlq-auditor and console binaries on the local stack, with its own
// topics, groups, Redis keys and ports — for 45 s. It requires that no
// legitimate principal was penalized and both abusers were; that the quota
// ledger counted the watched principal, the adjuster answered /v1/status with
// ticks, cpu and mem among its fresh signals (from the Telegraf the demo
// runs, which `make test` builds), and the dlq-auditor recorded the demo's dead letter; and, while the
// demo runs, that the console answers with the accounts the demo printed: the
// analyst signs in (a wrong password does not), the SRE opens the adjuster page
// and the dead letter's page, and headless Chromium (FLOODGATE_CHROMIUM,
// default /usr/bin/chromium) signs the analyst in and finds the demo's
// detection on the alerts page.
func TestDemoTraffic(t *testing.T) {
	stacktest.Needs(t, "needs the local stack and ~1 minute")
	chromium := browsertest.Bin(t)
	dir := t.TempDir()
	b := exec.Command("go", append([]string{"build", "-o", dir + "/"}, servicePackages()...)...)
	b.Stderr = os.Stderr
	require.NoError(t, b.Run())
	ctx, cancel := context.WithTimeout(context.Background(), 4*time.Minute)
	defer cancel()
	var out stacktest.Log
	type result struct {
		sum summary
		err error
	}
	done := make(chan result, 1)
	root := stacktest.Root(t)
	args := []string{"-duration", "45s", "-stay=false", "-bin", dir, "-logs", dir,
		"-telegraf", filepath.Join(root, ".local/bin/telegraf"), "-telegraf-config", filepath.Join(root, "deploy/telegraf/telegraf.conf"),
		"-limiter-addr", stacktest.FreeAddr(t), "-detector-addr", stacktest.FreeAddr(t), "-quota-addr", stacktest.FreeAddr(t), "-adjuster-addr", stacktest.FreeAddr(t),
		"-dlq-addr", stacktest.FreeAddr(t), "-console-addr", stacktest.FreeAddr(t), "-topics", fmt.Sprintf("floodgate.demotest.%d", time.Now().UnixNano())}
	go func() {
		sum, err := run(ctx, args, os.Getenv, &out)
		done <- result{sum, err}
	}()
	var res result
	ended := false
	defer func() { // a failure before the end: stop the demo before its logs directory goes
		if !ended {
			cancel()
			<-done
		}
	}()
	defer func() {
		t.Log(out.String())
		if t.Failed() {
			for _, svc := range append([]string{"telegraf"}, services...) {
				b, _ := os.ReadFile(filepath.Join(dir, "demo-"+svc+".log"))
				t.Logf("%s log (last 2 KB):\n%s", svc, b[max(0, len(b)-2048):])
			}
		}
	}()

	// While the demo runs: the console with the printed accounts.
	var consoleURL, analystPW, srePW string
	waitFor := func(what string, re *regexp.Regexp) []string {
		t.Helper()
		var m []string
		require.Eventually(t, func() bool {
			select {
			case r := <-done: // the demo ended early
				res = r
				done <- r
				return true
			default:
			}
			m = re.FindStringSubmatch(out.String())
			return m != nil
		}, 3*time.Minute, 100*time.Millisecond)
		require.NotNil(t, m, "the demo printed no %s (err %v)", what, res.err)
		return m
	}
	m := waitFor("console URL and accounts", regexp.MustCompile(`console: (http://\S+) .*\n\s+analyst\s+user demo-analyst\s+password (\S+)\n\s+sre\s+user demo-sre\s+password (\S+)\n`))
	consoleURL, analystPW, srePW = m[1], m[2], m[3]
	require.NotEqual(t, analystPW, srePW)

	analyst := newConsoleClient(t, consoleURL)
	require.Equal(t, http.StatusUnauthorized, analyst.login("demo-analyst", srePW), "the SRE's password is not the analyst's")
	require.Equal(t, http.StatusSeeOther, analyst.login("demo-analyst", analystPW))
	code, body := analyst.get("/alerts")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, "demo-analyst")

	sre := newConsoleClient(t, consoleURL)
	require.Equal(t, http.StatusSeeOther, sre.login("demo-sre", srePW))
	code, body = sre.get("/sre/adjuster")
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, `id="adjuster-mode"`, "the console reads the adjuster with the demo's token")
	require.NotContains(t, body, `class="error"`)
	dead := waitFor("dead letter", regexp.MustCompile(`recorded the demo dead letter (\S+) `))[1]
	code, body = sre.get("/sre/dlq/record?id=" + url.QueryEscape(dead))
	require.Equal(t, http.StatusOK, code, body)
	require.Contains(t, body, dead)
	require.Contains(t, body, "a dead letter on purpose", "the console shows the demo's dead letter from the dlq-auditor")

	// A browser: the analyst signs in and finds the rapid-fire bot's alert.
	bot := waitFor("rapid-fire detection", regexp.MustCompile(`rapid_fire detected: (bot:bot_spammer_\S+) `))[1]
	bctx := browsertest.Start(t, chromium, 60*time.Second)
	require.NoError(t, chromedp.Do(bctx,
		chromedp.Navigate(consoleURL+"/login"),
		chromedp.WaitVisible(chromedp.ID("username")),
		chromedp.SendKeys(chromedp.ID("username"), "demo-analyst"),
		chromedp.SendKeys(chromedp.ID("password"), analystPW),
		chromedp.Submit(chromedp.ID("password")),
		chromedp.WaitVisible(chromedp.ID("alert-rows")),
	))
	rows, err := chromedp.Run(bctx, chromedp.Text(chromedp.CSS("#alert-rows")))
	require.NoError(t, err)
	require.Contains(t, rows, bot, "the demo's detection is on the alerts page")

	select {
	case res = <-done:
		ended = true
	case <-ctx.Done():
		t.Fatal("the demo did not end")
	}
	require.NoError(t, res.err)
	sum := res.sum
	require.Equal(t, 30+20+10+4, sum.Legit)
	require.Zero(t, sum.LegitPenalized, "legitimate principals penalized: %v", sum.LegitPenalizedIDs)
	require.Equal(t, 2, sum.Abusive)
	require.Equal(t, 2, sum.AbusersCaught, "abusers missed: %v", sum.AbusersMissed)
	// The declared bot at 20 checks/s for 45 s, never limited: ~900 units.
	require.Greater(t, sum.QuotaUnits, int64(500), "quota ledger's count of %s", sum.QuotaPrincipal)
	require.GreaterOrEqual(t, sum.AdjusterTicks, 1, "adjuster ticks seen in /v1/status")
	// Telegraf wrote this host's cpu and mem under the run's fleet tag, and
	// the adjuster, narrowed to that fleet, read them (its tick at +30 s).
	require.Subset(t, sum.AdjusterFresh, []string{"cpu", "mem"}, "signals the adjuster read fresh")
	// The quota ledger's group starts at the topic's end before the event is
	// sent, so its dead letter is certain; the detector's too once its group
	// joined in time (it starts at the end when it owns its partitions).
	require.NotEmpty(t, sum.DeadLetters, "the dlq-auditor's records of the demo's malformed event")
	require.Contains(t, sum.DeadLetters, dead)
	require.Equal(t, consoleURL, sum.ConsoleURL)
	// Everything stopped: the console no longer answers, the secrets' files are gone.
	_, err = http.Get(consoleURL + "/healthz")
	require.Error(t, err, "the console still answers after the demo")
	left, err := filepath.Glob(filepath.Join(dir, "demo-*users*"))
	require.NoError(t, err)
	require.Empty(t, left)
}

func servicePackages() []string {
	var pkgs []string
	for _, s := range services {
		pkgs = append(pkgs, "github.com/floodgate-dev/floodgate/services/"+s)
	}
	return pkgs
}

// consoleClient is a cookie-keeping client of the console that does not
// follow redirects.
type consoleClient struct {
	t    *testing.T
	c    *http.Client
	base string
}

func newConsoleClient(t *testing.T, base string) *consoleClient {
	jar, err := cookiejar.New(nil)
	require.NoError(t, err)
	return &consoleClient{t: t, base: base, c: &http.Client{Jar: jar, Timeout: 20 * time.Second,
		CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}}
}

func (c *consoleClient) get(path string) (int, string) { return stacktest.Get(c.t, c.c, c.base+path) }

var csrfRE = regexp.MustCompile(`name="csrf" value="([^"]+)"`)

// login signs in through the form and returns the answer's status (303 to
// /alerts when the password is right).
func (c *consoleClient) login(user, password string) int {
	code, body := c.get("/login")
	require.Equal(c.t, http.StatusOK, code, body)
	m := csrfRE.FindStringSubmatch(body)
	require.NotNil(c.t, m, "no CSRF token on the sign-in page")
	res, _ := stacktest.PostForm(c.t, c.c, c.base+"/login", url.Values{"csrf": {m[1]}, "username": {user}, "password": {password}, "next": {"/alerts"}})
	if res.StatusCode == http.StatusSeeOther {
		require.Equal(c.t, "/alerts", res.Header.Get("Location"))
	}
	return res.StatusCode
}
