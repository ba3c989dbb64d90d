package chaos

import (
	"context"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"os/exec"
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
	// RealTime: the proxy runs under SCHED_FIFO (chrt -f 1), as a link's
	// latency is kept by the kernel, not by a process that waits its turn
	// on cores the limiter, Redis, the broker and the generator share.
	// False where the run may not raise priorities; Late says what that cost.
	RealTime bool
}

// StartFaultProxy starts a fault proxy in front of upstream, real-time
// where the run may.
func (e *Env) StartFaultProxy(ctx context.Context, upstream string) (*FaultProxy, error) {
	bin, args := filepath.Join(e.Bin, "faultproxy"), []string{"-upstream", upstream}
	realtime := exec.CommandContext(ctx, "chrt", "-f", "1", "true").Run() == nil
	if realtime {
		bin, args = "chrt", append([]string{"-f", "1", bin}, args...)
	}
	p, err := e.Start("faultproxy", bin, args, nil)
	if err != nil {
		return nil, err
	}
	fp := &FaultProxy{Proc: p, client: &http.Client{Timeout: 2 * time.Second}, RealTime: realtime}
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
	fields, err := f.get(ctx, "accepted", 1)
	if err != nil {
		return 0, err
	}
	return fields[0], nil
}

// Late counts the delayed replies the proxy passed on more than 2 ms late
// (its own scheduling on busy cores), and the latest by how much.
func (f *FaultProxy) Late(ctx context.Context) (int64, time.Duration, error) {
	fields, err := f.get(ctx, "late", 2)
	if err != nil {
		return 0, 0, err
	}
	return fields[0], time.Duration(fields[1]), nil
}

// Upstream counts the replies Redis sent more than 2 ms after the request
// before them (its own time and its wait for a CPU, before the proxy's
// delay), and the slowest.
func (f *FaultProxy) Upstream(ctx context.Context) (int64, time.Duration, error) {
	fields, err := f.get(ctx, "upstream", 2)
	if err != nil {
		return 0, 0, err
	}
	return fields[0], time.Duration(fields[1]), nil
}

// get reads n integers from the control endpoint what.
func (f *FaultProxy) get(ctx context.Context, what string, n int) ([]int64, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://"+f.control+"/"+what, nil)
	if err != nil {
		return nil, err
	}
	resp, err := f.client.Do(req)
	if err != nil {
		return nil, fmt.Errorf("faultproxy %s: %w", what, err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, 64))
	if err != nil {
		return nil, err
	}
	fields := strings.Fields(string(b))
	if len(fields) != n {
		return nil, fmt.Errorf("faultproxy %s: %q, want %d numbers", what, b, n)
	}
	out := make([]int64, n)
	for i, s := range fields {
		if out[i], err = strconv.ParseInt(s, 10, 64); err != nil {
			return nil, fmt.Errorf("faultproxy %s: %w", what, err)
		}
	}
	return out, nil
}
