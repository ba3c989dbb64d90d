// Package browsertest starts headless Chromium for the tests that drive the
// console in a real browser (the console's browser tests and the demo's). It
// is apart from stacktest so that only those tests link chromedp.
package browsertest

import (
	"context"
	"os"
	"testing"
	"time"

	"github.com/chromedp/chromedp"
	"github.com/stretchr/testify/require"
)

// Bin returns the Chromium binary to drive: FLOODGATE_CHROMIUM, default
// /usr/bin/chromium. It fails t when there is no executable there.
func Bin(t testing.TB) string {
	t.Helper()
	bin := os.Getenv("FLOODGATE_CHROMIUM")
	if bin == "" {
		bin = "/usr/bin/chromium"
	}
	if st, err := os.Stat(bin); err != nil || st.IsDir() || st.Mode()&0o111 == 0 {
		t.Fatalf("chromium not found at %s (set FLOODGATE_CHROMIUM or run deploy/local/browser.sh): %v", bin, err)
	}
	return bin
}

// Start starts headless Chromium at bin with the flags this machine needs (no
// sandbox as root, no background networking) and returns a context bounded to
// timeout; the browser is closed when the test ends.
func Start(t testing.TB, bin string, timeout time.Duration) context.Context {
	t.Helper()
	opts := []chromedp.ExecAllocatorOption{
		chromedp.ExecPath(bin), chromedp.Headless, chromedp.NoSandbox, chromedp.DisableGPU, chromedp.NoFirstRun,
		chromedp.Flag("disable-quic", true), chromedp.Flag("disable-background-networking", true),
		chromedp.Flag("disable-component-update", true), chromedp.Flag("disable-sync", true),
		chromedp.UserDataDir(t.TempDir()), chromedp.WindowSize(1280, 900),
	}
	actx, cancelAlloc := chromedp.NewExecAllocator(context.Background(), opts...)
	bctx, cancel := chromedp.NewContext(actx)
	// The first Run starts the browser; it must not carry the test's timeout.
	require.NoError(t, chromedp.Do(bctx, chromedp.Navigate("about:blank")), "start %s", bin)
	ctx, cancelT := context.WithTimeout(bctx, timeout)
	t.Cleanup(func() { cancelT(); cancel(); cancelAlloc() })
	return ctx
}
