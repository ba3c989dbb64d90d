// Package envoypeer installs and runs envoy ratelimit — the rate-limit
// service most Envoy and Istio deployments run — beside Floodgate, so the two
// can be asked the same questions in one run: the differential test of
// envoy ratelimit's semantics here, and the side-by-side benchmark.
//
// The peer is built with `go install` from the Go module proxy (as the local
// stack builds influxd), at a pinned version, into .local/bin.
package envoypeer

import (
	"bytes"
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

// Module and Version are the envoy ratelimit build used; its main package is
// src/service_cmd, its configuration checker src/config_check_cmd.
const (
	Module   = "github.com/envoyproxy/ratelimit"
	Version  = "v1.4.1-0.20260122083618-3fb702589d36"
	binName  = "envoy-ratelimit"
	checkBin = "envoy-ratelimit-config-check"
)

// Install builds envoy ratelimit into binDir unless it is there already
// (idempotent; the first build takes about a minute on a fresh machine) and
// returns its path.
func Install(ctx context.Context, binDir string) (string, error) {
	return install(ctx, binDir, "src/service_cmd", binName)
}

// InstallCheck builds envoy ratelimit's configuration checker
// (config_check_cmd: `-config_dir DIR` loads every file of DIR as the
// service does and exits 1 on the first error) into binDir unless it is
// there already, and returns its path.
func InstallCheck(ctx context.Context, binDir string) (string, error) {
	return install(ctx, binDir, "src/config_check_cmd", checkBin)
}

func install(ctx context.Context, binDir, pkg, name string) (string, error) {
	path := filepath.Join(binDir, name)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp, err := os.MkdirTemp("", "envoy-ratelimit-build")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "go", "install", Module+"/"+pkg+"@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s/%s@%s: %w\n%s", Module, pkg, Version, err, out)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(tmp, filepath.Base(pkg)), path); err != nil {
		return "", err
	}
	return path, nil
}

// Check runs the checker bin on dir: nil when envoy ratelimit loads it, else
// an error holding what the checker said.
func Check(ctx context.Context, bin, dir string) error {
	out, err := exec.CommandContext(ctx, bin, "-config_dir", dir).CombinedOutput()
	if err != nil {
		return fmt.Errorf("envoy ratelimit refuses %s: %w\n%s", dir, err, out)
	}
	if !bytes.Contains(out, []byte("all rate limit configs ok")) {
		return fmt.Errorf("envoy ratelimit's checker on %s said: %s", dir, out)
	}
	return nil
}

// Peer is a running envoy ratelimit.
type Peer struct {
	GRPCAddr, HTTPAddr string
	cmd                *exec.Cmd
	logs               *stacktest.Log
}

// Options configure Start.
type Options struct {
	Bin       string            // from Install
	ConfigDir string            // envoy ratelimit YAML files (copied into its runtime layout)
	RedisAddr string            // host:port
	KeyPrefix string            // CACHE_KEY_PREFIX, so runs never share counters
	Env       map[string]string // more settings (SHADOW_MODE, …)
	// Wrap, when set, is a command the peer runs under, its binary and
	// nothing else appended (taskset -c 1: pinned from its start, so Go
	// sizes GOMAXPROCS to the cores it is given; the process id is the
	// peer's, as taskset execs it).
	Wrap []string
}

// Start runs envoy ratelimit on loopback ports of its own, with statsd off
// and its configuration from o.ConfigDir, and waits until its gRPC port
// answers.
func Start(ctx context.Context, o Options) (*Peer, error) {
	root, err := os.MkdirTemp("", "envoy-ratelimit-runtime")
	if err != nil {
		return nil, err
	}
	cfgDir := filepath.Join(root, "ratelimit", "config")
	if err := os.MkdirAll(cfgDir, 0o755); err != nil {
		return nil, err
	}
	// Every file, whatever its name: envoy ratelimit's runtime loader reads
	// them all (github.com/lyft/goruntime), so the directory is tried as it is.
	entries, err := os.ReadDir(o.ConfigDir)
	if err != nil {
		return nil, err
	}
	for _, e := range entries {
		if !e.Type().IsRegular() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(o.ConfigDir, e.Name()))
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(cfgDir, e.Name()), b, 0o644); err != nil {
			return nil, err
		}
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	p := &Peer{GRPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), logs: &stacktest.Log{}}
	env := map[string]string{
		"HOST": "127.0.0.1", "PORT": fmt.Sprint(ports[1]), "GRPC_HOST": "127.0.0.1", "GRPC_PORT": fmt.Sprint(ports[0]),
		"DEBUG_HOST": "127.0.0.1", "DEBUG_PORT": fmt.Sprint(ports[2]),
		"USE_STATSD": "false", "LOG_LEVEL": "warn", "REDIS_SOCKET_TYPE": "tcp", "REDIS_URL": o.RedisAddr,
		"RUNTIME_ROOT": root, "RUNTIME_SUBDIRECTORY": "ratelimit", "CACHE_KEY_PREFIX": o.KeyPrefix,
	}
	for k, v := range o.Env {
		env[k] = v
	}
	p.cmd = exec.Command(o.Bin)
	if len(o.Wrap) > 0 {
		p.cmd = exec.Command(o.Wrap[0], append(o.Wrap[1:], o.Bin)...)
	}
	for k, v := range env {
		p.cmd.Env = append(p.cmd.Env, k+"="+v)
	}
	p.cmd.Stdout, p.cmd.Stderr = p.logs, p.logs
	if err := p.cmd.Start(); err != nil {
		return nil, fmt.Errorf("start envoy ratelimit: %w", err)
	}
	deadline := time.Now().Add(30 * time.Second)
	for time.Now().Before(deadline) {
		if c, err := net.DialTimeout("tcp", p.GRPCAddr, 200*time.Millisecond); err == nil {
			_ = c.Close()
			return p, nil
		}
		select {
		case <-ctx.Done():
			p.Stop()
			return nil, ctx.Err()
		case <-time.After(100 * time.Millisecond):
		}
	}
	p.Stop()
	return nil, fmt.Errorf("envoy ratelimit did not listen on %s within 30s: %s", p.GRPCAddr, p.logs.String())
}

// Logs is what the peer printed.
func (p *Peer) Logs() string { return p.logs.String() }

// ConfigError is the peer's complaint about its configuration ("Error
// loading new configuration: …" in its log), or "" when it loaded it.
func (p *Peer) ConfigError() string {
	const mark = "Error loading new configuration"
	s := p.logs.String()
	i := strings.Index(s, mark)
	if i < 0 {
		return ""
	}
	line, _, _ := strings.Cut(s[i:], "\n")
	return line
}

// Pid is the peer's process id.
func (p *Peer) Pid() int { return p.cmd.Process.Pid }

// Stop ends the peer.
func (p *Peer) Stop() {
	if p.cmd != nil && p.cmd.Process != nil {
		_ = p.cmd.Process.Kill()
		_ = p.cmd.Wait()
	}
}

func freePorts(n int) ([]int, error) {
	var out []int
	var lns []net.Listener
	defer func() {
		for _, l := range lns {
			_ = l.Close()
		}
	}()
	for range n {
		l, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			return nil, err
		}
		lns = append(lns, l)
		out = append(out, l.Addr().(*net.TCPAddr).Port)
	}
	return out, nil
}
