package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"
)

// FaultProxy is loadtest/cmd/faultproxy started by the run: a latency and
// stall proxy in front of one Redis node, in its own process, so that the
// chaos process's scheduling (the load generator runs there) is not counted
// as Redis latency.
type FaultProxy struct {
	*Proc
	Addr    string // where clients connect
	control string
	client  *http.Client
}

// StartFaultProxy starts a fault proxy in front of upstream.
func (e *Env) StartFaultProxy(ctx context.Context, upstream string) (*FaultProxy, error) {
	p, err := e.Start("faultproxy", filepath.Join(e.Bin, "faultproxy"), []string{"-upstream", upstream}, nil)
	if err != nil {
		return nil, err
	}
	fp := &FaultProxy{Proc: p, client: &http.Client{Timeout: 2 * time.Second}}
	err = waitFor(ctx, 10*time.Second, "faultproxy address", func() error {
		if p.Exited() {
			return fmt.Errorf("exited, see %s: %w", p.LogPath, errStop)
		}
		b, err := os.ReadFile(p.LogPath)
		if err != nil {
			return err
		}
		for _, line := range strings.Split(string(b), "\n") {
			if f := strings.Fields(line); len(f) == 4 && f[0] == "proxy" && f[2] == "control" {
				fp.Addr, fp.control = f[1], f[3]
				return nil
			}
		}
		return fmt.Errorf("no address yet")
	})
	if err != nil {
		p.Kill()
		return nil, err
	}
	return fp, nil
}

// SetDelay holds every reply d after it arrived (0 removes the delay).
func (f *FaultProxy) SetDelay(ctx context.Context, d time.Duration) error {
	return f.post(ctx, "delay", d)
}

// Stall holds every byte in both directions for d from now.
func (f *FaultProxy) Stall(ctx context.Context, d time.Duration) error {
	return f.post(ctx, "stall", d)
}

func (f *FaultProxy) post(ctx context.Context, what string, d time.Duration) error {
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, "http://"+f.control+"/"+what+"?d="+url.QueryEscape(d.String()), nil)
	if err != nil {
		return err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return fmt.Errorf("faultproxy %s: %w", what, err)
	}
	defer resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 512))
		return fmt.Errorf("faultproxy %s: %s: %s", what, resp.Status, b)
	}
	return nil
}

// Accepted counts the client connections accepted so far.
func (f *FaultProxy) Accepted(ctx context.Context) (int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.control+"/accepted", nil)
	if err != nil {
		return 0, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return 0, fmt.Errorf("faultproxy accepted: %w", err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64))
	if err != nil {
		return 0, err
	}
	return strconv.ParseInt(strings.TrimSpace(string(b)), 10, 64)
}
