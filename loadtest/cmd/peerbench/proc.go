package main

import (
	"context"
	"fmt"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/floodgate-dev/floodgate/loadtest/internal/cputime"
	"github.com/redis/go-redis/v9"
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
