package main

import (
	"context"
	"fmt"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
	"github.com/floodgate-dev/floodgate/pkg/config"
)

// redisPid asks Redis for its process id (INFO server).
func redisPid(ctx context.Context, addr string) (int, error) {
	c := redis.NewClient(&redis.Options{Addr: addr, DisableIdentity: true})
	defer c.Close()
	info, err := c.Info(ctx, "server").Result()
	if err != nil {
		return 0, fmt.Errorf("redis INFO: %w", err)
	}
	for _, line := range strings.Split(info, "\r\n") {
		if v, ok := strings.CutPrefix(line, "process_id:"); ok {
			return strconv.Atoi(v)
		}
	}
	return 0, fmt.Errorf("redis INFO server has no process_id")
}

// brokerPid finds the local stack's Kafka-protocol broker (deploy/local/broker,
// installed as floodgate-broker) among this machine's processes; 0 when it is
// not running here.
func brokerPid() int {
	dirs, _ := filepath.Glob("/proc/[0-9]*")
	for _, d := range dirs {
		cmd, err := os.ReadFile(filepath.Join(d, "cmdline"))
		if err != nil {
			continue
		}
		exe, _, _ := strings.Cut(string(cmd), "\x00")
		if filepath.Base(exe) == "floodgate-broker" {
			pid, _ := strconv.Atoi(filepath.Base(d))
			return pid
		}
	}
	return 0
}

// pids are the processes on a call's path whose CPU a round measures.
type pids struct{ service, redis, broker int }

func (p pids) cpu() [3]time.Duration {
	return [3]time.Duration{cputime.Of(p.service), cputime.Of(p.redis), cputime.Of(p.broker)}
}

type limiterAddrs struct {
	http, grpc, debug string
	pid               int
}

// stackAddrs are the Redis and broker the services use, and their processes.
type stackAddrs struct {
	redis, broker       string
	redisPid, brokerPid int
}

// limiterTopics are the topics a private broker is given: the limiter's
// decision events (FLOODGATE_DECISIONS_TOPIC's default).
var limiterTopics = []string{config.DefaultDecisionsTopic}

// startLimiter runs the limiter built from root, or the binary prebuilt
// when it is set (-baseline), with the benchmark's rules and extra
// environment (-transport).
func startLimiter(root, prebuilt, envoyDir, algorithm string, lease int, place placement, stack stackAddrs, debug bool, extra ...string) (limiterAddrs, func(), error) {
	dir, err := os.MkdirTemp("", "peerbench-limiter")
	if err != nil {
		return limiterAddrs{}, nil, err
	}
	bin := filepath.Join(dir, "limiter")
	if prebuilt != "" {
		bin = prebuilt
	} else {
		cmd := exec.Command("go", "build", "-o", bin, "./services/limiter")
		cmd.Dir = root
		if out, err := cmd.CombinedOutput(); err != nil {
			return limiterAddrs{}, nil, fmt.Errorf("build limiter: %w: %s", err, out)
		}
	}
	httpAddr, grpcAddr := freeAddr(), freeAddr()
	// 100/s per principal, every check to Redis: envoy ratelimit's fixed
	// window by default, as the peer counts it.
	rules := filepath.Join(dir, "rules.yaml")
	body := fmt.Sprintf("version: 1\nrules:\n  - {id: principal, tier: principal, limit: 100, period: 1s, algorithm: %s, lease: %d}\n", algorithm, lease)
	if err := os.WriteFile(rules, []byte(body), 0o644); err != nil {
		return limiterAddrs{}, nil, err
	}
	rule := "FLOODGATE_LIMITER_RULES=" + rules
	lim := place.command(place.service, bin)
	lim.Env = append(os.Environ(), "FLOODGATE_LIMITER_ADDR="+httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR="+grpcAddr,
		"FLOODGATE_LIMITER_ENVOY_CONFIG="+envoyDir, rule, "FLOODGATE_LIMITER_INFLUX_INTERVAL=0",
		"FLOODGATE_JOURNAL_DIR="+filepath.Join(dir, "journal"), "FLOODGATE_GATEWAY=peerbench",
		"FLOODGATE_REDIS_ADDRS="+stack.redis, "FLOODGATE_KAFKA_BROKERS="+stack.broker,
		// A closed loop wants every call decided, as the peer (which has no
		// entry gate) decides them: the gate's refusals of callers beyond
		// its round would count as cheap answers.
		"FLOODGATE_LIMITER_GRPC_GATE_MAX=0")
	lim.Env = append(lim.Env, extra...)
	debugAddr := ""
	if debug {
		debugAddr = freeAddr()
		lim.Env = append(lim.Env, "FLOODGATE_LIMITER_DEBUG_ADDR="+debugAddr)
	}
	lim.Stdout, lim.Stderr = os.Stderr, os.Stderr
	if err := lim.Start(); err != nil {
		return limiterAddrs{}, nil, err
	}
	stop := func() { _ = lim.Process.Signal(syscall.SIGTERM); _ = lim.Wait(); os.RemoveAll(dir) }
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(100 * time.Millisecond) {
		if c, err := net.DialTimeout("tcp", grpcAddr, 200*time.Millisecond); err == nil {
			c.Close()
			return limiterAddrs{http: httpAddr, grpc: grpcAddr, debug: debugAddr, pid: lim.Process.Pid}, stop, nil
		}
	}
	stop()
	return limiterAddrs{}, nil, fmt.Errorf("limiter did not listen on %s", grpcAddr)
}

func freeAddr() string {
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		panic(err)
	}
	defer l.Close()
	return l.Addr().String()
}
