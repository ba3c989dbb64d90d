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
	"time"
)

// Module and Version are the envoy ratelimit build used; its main package is
// src/service_cmd.
const (
	Module  = "github.com/envoyproxy/ratelimit"
	Version = "v1.4.1-0.20260122083618-3fb702589d36"
	binName = "envoy-ratelimit"
)

// Install builds envoy ratelimit into binDir unless it is there already
// (idempotent; the first build takes about a minute on a fresh machine) and
// returns its path.
func Install(ctx context.Context, binDir string) (string, error) {
	path := filepath.Join(binDir, binName)
	if _, err := os.Stat(path); err == nil {
		return path, nil
	}
	tmp, err := os.MkdirTemp("", "envoy-ratelimit-build")
	if err != nil {
		return "", err
	}
	defer os.RemoveAll(tmp)
	cmd := exec.CommandContext(ctx, "go", "install", Module+"/src/service_cmd@"+Version)
	cmd.Env = append(os.Environ(), "GOBIN="+tmp, "GOFLAGS=-mod=mod")
	cmd.Dir = tmp
	if out, err := cmd.CombinedOutput(); err != nil {
		return "", fmt.Errorf("go install %s@%s: %w\n%s", Module, Version, err, out)
	}
	if err := os.MkdirAll(binDir, 0o755); err != nil {
		return "", err
	}
	if err := os.Rename(filepath.Join(tmp, "service_cmd"), path); err != nil {
		return "", err
	}
	return path, nil
}

// Peer is a running envoy ratelimit.
type Peer struct {
	GRPCAddr, HTTPAddr string
	cmd                *exec.Cmd
	logs               *bytes.Buffer
}

// Options configure Start.
type Options struct {
	Bin       string            // from Install
	ConfigDir string            // envoy ratelimit YAML files (copied into its runtime layout)
	RedisAddr string            // host:port
	KeyPrefix string            // CACHE_KEY_PREFIX, so runs never share counters
	Env       map[string]string // more settings (SHADOW_MODE, …)
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
	files, err := filepath.Glob(filepath.Join(o.ConfigDir, "*.yaml"))
	if err != nil {
		return nil, err
	}
	for _, f := range files {
		b, err := os.ReadFile(f)
		if err != nil {
			return nil, err
		}
		if err := os.WriteFile(filepath.Join(cfgDir, filepath.Base(f)), b, 0o644); err != nil {
			return nil, err
		}
	}
	ports, err := freePorts(3)
	if err != nil {
		return nil, err
	}
	p := &Peer{GRPCAddr: fmt.Sprintf("127.0.0.1:%d", ports[0]), HTTPAddr: fmt.Sprintf("127.0.0.1:%d", ports[1]), logs: &bytes.Buffer{}}
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
