package bench

import (
	"context"
	"fmt"
	"net/http"
	"time"
)

// WaitReady polls url (a service's /readyz) until it answers 200, for at most
// within; it returns an error naming url when it never did, or ctx's error.
func WaitReady(ctx context.Context, url string, within time.Duration) error {
	deadline := time.Now().Add(within)
	for {
		req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
		if err != nil {
			return err
		}
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if resp.StatusCode == http.StatusOK {
				return nil
			}
		}
		if !time.Now().Before(deadline) {
			return fmt.Errorf("%s not ready after %s", url, within)
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
}
