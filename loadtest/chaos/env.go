// Package chaos runs Floodgate's fault scenarios: the built services as
// subprocesses against components this package starts itself on free ports
// (its own redis-server processes, its own Kafka-protocol broker processes
// built from deploy/local/broker, a DynamoDB fault proxy, a PagerDuty
// receiver), so a fault never touches the shared local stack. Only DynamoDB
// Local is shared, under a table prefix unique to the run.
//
// Each scenario puts a load on the pipeline, injects one fault, removes it and
// measures what the fault cost: acknowledged decision events lost, ledger
// exactness, detections missed, limiter availability and latency.
package chaos

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"syscall"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
)

// Options configures an Env.
type Options struct {
	// Root is the repository root (where go.mod is); empty: found from the
	// working directory.
	Root string
	// WorkDir holds binaries, data directories and logs; empty: a new
	// temporary directory, removed by Close unless KeepWorkDir.
	WorkDir     string
	KeepWorkDir bool
	// DynamoEndpoint is the DynamoDB Local the ledger lives on (shared; the
	// tables get a per-run prefix).
	DynamoEndpoint string
	Logger         *slog.Logger
}

// Env owns every process and table a chaos run starts; Close stops and
// removes them.
type Env struct {
	Root, Dir, Bin string
	DynamoEndpoint string
	Log            *slog.Logger

	mu      sync.Mutex
	procs   []*Proc
	tables  []string
	db      *dynamodb.Client
	keepDir bool
	seq     int
}

// NewEnv builds the limiter, detector, quota, deferred, adjuster and broker
// binaries into a work directory.
func NewEnv(ctx context.Context, o Options) (*Env, error) {
	if o.Logger == nil {
		o.Logger = slog.New(slog.DiscardHandler)
	}
	if o.DynamoEndpoint == "" {
		o.DynamoEndpoint = "http://127.0.0.1:8000"
	}
	root := o.Root
	if root == "" {
		var err error
		if root, err = findRoot(); err != nil {
			return nil, err
		}
	}
	dir := o.WorkDir
	keep := o.KeepWorkDir
	if dir == "" {
		var err error
		if dir, err = os.MkdirTemp("", "floodgate-chaos-"); err != nil {
			return nil, fmt.Errorf("create work dir: %w", err)
		}
	} else {
		keep = true
		if err := os.MkdirAll(dir, 0o755); err != nil {
			return nil, fmt.Errorf("create work dir: %w", err)
		}
	}
	e := &Env{Root: root, Dir: dir, Bin: filepath.Join(dir, "bin"), DynamoEndpoint: o.DynamoEndpoint, Log: o.Logger, keepDir: keep}
	cmd := exec.CommandContext(ctx, "go", "build", "-o", e.Bin+"/",
		"./services/limiter", "./services/detector", "./services/quota", "./services/deferred", "./services/adjuster", "./deploy/local/broker",
		"./loadtest/cmd/faultproxy")
	cmd.Dir = root
	if out, err := cmd.CombinedOutput(); err != nil {
		return nil, fmt.Errorf("build services: %w: %s", err, out)
	}
	db, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: o.DynamoEndpoint})
	if err != nil {
		return nil, fmt.Errorf("dynamodb client: %w", err)
	}
	e.db = db
	return e, nil
}

func findRoot() (string, error) {
	dir, err := os.Getwd()
	if err != nil {
		return "", fmt.Errorf("working directory: %w", err)
	}
	for {
		if b, err := os.ReadFile(filepath.Join(dir, "go.mod")); err == nil && len(b) > 0 {
			return dir, nil
		}
		parent := filepath.Dir(dir)
		if parent == dir {
			return "", errors.New("find repository root: no go.mod above the working directory")
		}
		dir = parent
	}
}

// Close kills every process still running, deletes the tables and the work
// directory (unless kept).
func (e *Env) Close() {
	e.mu.Lock()
	procs, tables := e.procs, e.tables
	e.procs, e.tables = nil, nil
	e.mu.Unlock()
	for i := len(procs) - 1; i >= 0; i-- {
		procs[i].Kill()
	}
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	for _, t := range tables {
		_, _ = e.db.DeleteTable(ctx, &dynamodb.DeleteTableInput{TableName: aws.String(t)})
	}
	if !e.keepDir {
		_ = os.RemoveAll(e.Dir)
	}
}

// TempDir returns a new directory inside the work directory.
func (e *Env) TempDir(name string) string {
	e.mu.Lock()
	e.seq++
	n := e.seq
	e.mu.Unlock()
	d := filepath.Join(e.Dir, fmt.Sprintf("%s-%d", name, n))
	_ = os.MkdirAll(d, 0o755)
	return d
}

// RulesFile writes a limiter rules file (FLOODGATE_LIMITER_RULES) with
// yaml into a new directory named after name, and returns its path.
func (e *Env) RulesFile(name, yaml string) (string, error) {
	path := filepath.Join(e.TempDir(name), "rules.yaml")
	return path, os.WriteFile(path, []byte(yaml), 0o644)
}

// DB is a client of the real DynamoDB Local (not through any fault proxy).
func (e *Env) DB() *dynamodb.Client { return e.db }

// Tables creates every DynamoDB table of the migrations under a new prefix and
// returns the prefix; Close deletes them.
func (e *Env) Tables(ctx context.Context) (string, error) {
	ms, err := migrations.Load()
	if err != nil {
		return "", fmt.Errorf("load migrations: %w", err)
	}
	prefix := fmt.Sprintf("chaos%d_", time.Now().UnixNano())
	var specs []migrations.TableSpec
	for _, m := range ms {
		specs = append(specs, m.DynamoDB.Tables...)
	}
	d := &migrations.Dynamo{Client: e.db, Prefix: prefix}
	e.mu.Lock()
	for _, s := range specs {
		e.tables = append(e.tables, prefix+s.Name)
	}
	e.mu.Unlock()
	if err := d.Apply(ctx, specs, func(string) {}); err != nil {
		return "", fmt.Errorf("create tables on %s (is DynamoDB Local up? make up): %w", e.DynamoEndpoint, err)
	}
	return prefix, nil
}

// FreePort returns a TCP port on 127.0.0.1 nobody listens on right now.
func FreePort() (int, error) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		return 0, fmt.Errorf("find a free port: %w", err)
	}
	defer ln.Close()
	return ln.Addr().(*net.TCPAddr).Port, nil
}

// FreeAddr returns "127.0.0.1:port" for a port FreePort finds, an address for a
// service to listen on.
func FreeAddr() (string, error) {
	port, err := FreePort()
	if err != nil {
		return "", err
	}
	return "127.0.0.1:" + strconv.Itoa(port), nil
}

// Proc is one subprocess with its log file.
type Proc struct {
	Name, LogPath string
	cmd           *exec.Cmd
	done          chan struct{}
	err           error
	logf          *os.File
}

// Start runs bin with args and env (added to this process's environment),
// logging to <workdir>/logs/<name>-<n>.log.
func (e *Env) Start(name, bin string, args, env []string) (*Proc, error) {
	logs := filepath.Join(e.Dir, "logs")
	if err := os.MkdirAll(logs, 0o755); err != nil {
		return nil, fmt.Errorf("create log dir: %w", err)
	}
	e.mu.Lock()
	e.seq++
	path := filepath.Join(logs, fmt.Sprintf("%s-%02d.log", name, e.seq))
	e.mu.Unlock()
	f, err := os.Create(path)
	if err != nil {
		return nil, fmt.Errorf("create log %s: %w", path, err)
	}
	cmd := exec.Command(bin, args...)
	cmd.Env = append(os.Environ(), env...)
	cmd.Stdout, cmd.Stderr = f, f
	cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := cmd.Start(); err != nil {
		_ = f.Close()
		return nil, fmt.Errorf("start %s: %w", name, err)
	}
	p := &Proc{Name: name, LogPath: path, cmd: cmd, done: make(chan struct{}), logf: f}
	go func() {
		p.err = cmd.Wait()
		_ = f.Close()
		close(p.done)
	}()
	e.mu.Lock()
	e.procs = append(e.procs, p)
	e.mu.Unlock()
	e.Log.Debug("started", "proc", name, "pid", cmd.Process.Pid, "log", path)
	return p, nil
}

// Pid is the process id.
func (p *Proc) Pid() int { return p.cmd.Process.Pid }

// Kill sends SIGKILL and waits for the process to be gone.
func (p *Proc) Kill() {
	select {
	case <-p.done:
		return
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGKILL)
	<-p.done
}

// Stop sends SIGTERM and waits up to timeout for a clean exit; after that it
// kills the process and reports an error.
func (p *Proc) Stop(timeout time.Duration) error {
	select {
	case <-p.done:
		return p.err
	default:
	}
	_ = p.cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-p.done:
		if p.err != nil {
			return fmt.Errorf("%s exited: %w", p.Name, p.err)
		}
		return nil
	case <-time.After(timeout):
		p.Kill()
		return fmt.Errorf("%s did not exit within %v of SIGTERM", p.Name, timeout)
	}
}

// Exited reports whether the process has ended.
func (p *Proc) Exited() bool {
	select {
	case <-p.done:
		return true
	default:
		return false
	}
}

// Redis is a redis-server this run owns: no persistence, so a restart is empty.
type Redis struct {
	Port int
	Addr string
	e    *Env
	proc *Proc
}

// StartStack starts a scenario's Redis and broker.
func (e *Env) StartStack(ctx context.Context) (*Redis, *Broker, error) {
	rd, err := e.StartRedis(ctx)
	if err != nil {
		return nil, nil, err
	}
	b, err := e.StartBroker(ctx)
	if err != nil {
		return nil, nil, err
	}
	return rd, b, nil
}

// StartStackTables starts a scenario's Redis and broker and creates its
// tables (their name prefix).
func (e *Env) StartStackTables(ctx context.Context) (*Redis, *Broker, string, error) {
	rd, b, err := e.StartStack(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	prefix, err := e.Tables(ctx)
	if err != nil {
		return nil, nil, "", err
	}
	return rd, b, prefix, nil
}

// StartRedis starts a redis-server on a free port.
func (e *Env) StartRedis(ctx context.Context) (*Redis, error) {
	port, err := FreePort()
	if err != nil {
		return nil, err
	}
	r := &Redis{Port: port, Addr: "127.0.0.1:" + strconv.Itoa(port), e: e}
	return r, r.Start(ctx)
}

// Start (re)starts the server on its port, empty.
func (r *Redis) Start(ctx context.Context) error {
	dir := r.e.TempDir("redis")
	p, err := r.e.Start("redis", "redis-server", []string{"--port", strconv.Itoa(r.Port), "--bind", "127.0.0.1",
		"--save", "", "--appendonly", "no", "--dir", dir}, nil)
	if err != nil {
		return fmt.Errorf("start redis-server (apt-get install redis-server): %w", err)
	}
	r.proc = p
	c := redis.NewClient(&redis.Options{Addr: r.Addr})
	defer c.Close()
	return waitFor(ctx, 10*time.Second, "redis "+r.Addr, func() error {
		if p.Exited() {
			return fmt.Errorf("exited, see %s: %w", p.LogPath, errStop)
		}
		return c.Ping(ctx).Err()
	})
}

// Kill9 kills the server (SIGKILL); its data is gone.
func (r *Redis) Kill9() { r.proc.Kill() }

// Client returns a client of this server.
func (r *Redis) Client() *redis.Client { return redis.NewClient(&redis.Options{Addr: r.Addr}) }

var errStop = errors.New("stop waiting")

// waitFor polls f until it returns nil, ctx ends, timeout passes, or f
// returns an error wrapping errStop.
func waitFor(ctx context.Context, timeout time.Duration, what string, f func() error) error {
	deadline := time.Now().Add(timeout)
	var err error
	for {
		if err = f(); err == nil {
			return nil
		}
		if errors.Is(err, errStop) {
			return fmt.Errorf("%s: %w", what, err)
		}
		if time.Now().After(deadline) {
			return fmt.Errorf("%s: not ready after %v: %w", what, timeout, err)
		}
		select {
		case <-ctx.Done():
			return fmt.Errorf("%s: %w", what, ctx.Err())
		case <-time.After(100 * time.Millisecond):
		}
	}
}

func hostname() string {
	h, err := os.Hostname()
	if err != nil {
		return "unknown host"
	}
	return h
}

// Keep leaves the work directory (logs, data) in place after Close.
func (e *Env) Keep() {
	e.mu.Lock()
	e.keepDir = true
	e.mu.Unlock()
}
