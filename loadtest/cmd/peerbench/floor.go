package main

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
)

// floorAddrs are the do-nothing servers (loadtest/cmd/httpfloor -serve):
// a gRPC rate-limit service answering OK (on grpc-go, and on pkg/grpcfast)
// and an HTTP check server answering a fixed decision (on net/http, and on
// fasthttp, the limiter's HTTP server), each a process of its own.
type floorAddrs struct {
	grpc, grpcFast, http, httpFast             string
	grpcPid, grpcFastPid, httpPid, httpFastPid int
}

// startFloors builds httpfloor and starts its gRPC, net/http and fasthttp
// servers on the service cores (GOMAXPROCS sized to them).
func startFloors(root string, place placement) (floorAddrs, func(), error) {
	dir, err := os.MkdirTemp("", "peerbench-floor")
	if err != nil {
		return floorAddrs{}, nil, err
	}
	bin := filepath.Join(dir, "httpfloor")
	build := exec.Command("go", "build", "-o", bin, "./loadtest/cmd/httpfloor")
	build.Dir = root
	if out, err := build.CombinedOutput(); err != nil {
		os.RemoveAll(dir)
		return floorAddrs{}, nil, fmt.Errorf("build httpfloor: %w: %s", err, out)
	}
	var stops []func()
	stopAll := func() {
		for _, s := range stops {
			s()
		}
		os.RemoveAll(dir)
	}
	serve := func(mode string) (string, int, error) {
		cmd := place.command(place.service, bin, "-serve", mode)
		out, err := cmd.StdoutPipe()
		if err != nil {
			return "", 0, err
		}
		cmd.Stderr = os.Stderr
		if err := cmd.Start(); err != nil {
			return "", 0, err
		}
		stops = append(stops, func() { _ = cmd.Process.Signal(syscall.SIGTERM); _ = cmd.Wait() })
		r := bufio.NewReader(out)
		addr, err := r.ReadString('\n')
		if err != nil {
			return "", 0, fmt.Errorf("httpfloor -serve %s: no address: %w", mode, err)
		}
		go func() { _, _ = io.Copy(io.Discard, r) }()
		return strings.TrimSpace(addr), cmd.Process.Pid, nil
	}
	var f floorAddrs
	for _, fl := range []struct {
		mode string
		addr *string
		pid  *int
	}{{"grpc", &f.grpc, &f.grpcPid}, {"grpcfast", &f.grpcFast, &f.grpcFastPid}, {"nethttp", &f.http, &f.httpPid}, {"fasthttp", &f.httpFast, &f.httpFastPid}} {
		if *fl.addr, *fl.pid, err = serve(fl.mode); err != nil {
			stopAll()
			return floorAddrs{}, nil, err
		}
	}
	return f, stopAll, nil
}

// profiler takes Floodgate's CPU profile over a round and its allocation
// profile after it, from its pprof listener, into dir.
type profiler struct {
	dir, debugAddr string
	duration       time.Duration
}

// start begins a CPU profile of the coming round (its length less a
// second, so that it ends inside it); the function returned waits for it,
// then takes the allocation profile, and writes both.
func (p profiler) start(proto string) func() error {
	if p.dir == "" || p.debugAddr == "" {
		return nil
	}
	secs := max(int((p.duration-time.Second)/time.Second), 1)
	done := make(chan error, 1)
	go func() {
		done <- fetchTo(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", p.debugAddr, secs), p.cpuPath(proto))
	}()
	return func() error {
		if err := <-done; err != nil {
			return err
		}
		return fetchTo("http://"+p.debugAddr+"/debug/pprof/allocs", filepath.Join(p.dir, "floodgate-"+proto+".allocs.pprof"))
	}
}

// cpuPath is where the CPU profile of proto's round goes.
func (p profiler) cpuPath(proto string) string {
	return filepath.Join(p.dir, "floodgate-"+proto+".cpu.pprof")
}

// fetchTo writes the profile at url to path, in a directory it creates.
func fetchTo(url, path string) error {
	if err := os.MkdirAll(filepath.Dir(path), 0o755); err != nil {
		return err
	}
	if err := cputime.Profile(context.Background(), url, path); err != nil {
		return err
	}
	fmt.Printf("profile: %s\n", path)
	return nil
}
