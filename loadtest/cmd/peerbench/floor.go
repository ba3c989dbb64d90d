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
	dir string
	// debugAddrs: the pprof listener of each target profiled, by name
	// (Floodgate's, and the -baseline's when there is one).
	debugAddrs map[string]string
	duration   time.Duration
}

// start begins a CPU profile of name's coming round (its length less a
// second, so that it ends inside it), or returns nil when name is not
// profiled; the function returned waits for it, then takes the allocation
// profile, and writes both.
func (p profiler) start(name, proto string) func() error {
	addr := p.debugAddrs[name]
	if p.dir == "" || addr == "" {
		return nil
	}
	secs := max(int((p.duration-time.Second)/time.Second), 1)
	done := make(chan error, 1)
	go func() {
		done <- fetchTo(fmt.Sprintf("http://%s/debug/pprof/profile?seconds=%d", addr, secs), p.cpuPath(name, proto))
	}()
	return func() error {
		if err := <-done; err != nil {
			return err
		}
		return fetchTo("http://"+addr+"/debug/pprof/allocs", filepath.Join(p.dir, p.file(name, proto)+".allocs.pprof"))
	}
}

// file is the start of the name of name's profiles for proto:
// floodgate-grpc, floodgate-baseline-grpc.
func (p profiler) file(name, proto string) string {
	return strings.ReplaceAll(name, " ", "-") + "-" + proto
}

// cpuPath is where the CPU profile of name's round for proto goes.
func (p profiler) cpuPath(name, proto string) string {
	return filepath.Join(p.dir, p.file(name, proto)+".cpu.pprof")
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
