package redistest

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"math/rand/v2"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// Proc is a redis-server (or sentinel) process started on a loopback port of
// its own, for fault tests: it can be killed, stalled and restarted without
// touching the shared stack.
type Proc struct {
	Addr string
	Port int
	Dir  string
	args []string
	cmd  *exec.Cmd
}

// FreePort returns a loopback port that is free, and whose cluster bus port
// (+10000) is free too.
func FreePort() (int, error) {
	for range 200 {
		p := 20000 + rand.IntN(35000)
		if free(p) && free(p+10000) {
			return p, nil
		}
	}
	return 0, errors.New("no free loopback port pair found")
}

func free(port int) bool {
	ln, err := net.Listen("tcp", "127.0.0.1:"+strconv.Itoa(port))
	if err != nil {
		return false
	}
	_ = ln.Close()
	return true
}

// StartProc starts redis-server on port (0 = a free one) with its working
// directory under dir, no persistence, and extra arguments; it returns once
// the server answers PING.
func StartProc(dir string, port int, extra ...string) (*Proc, error) {
	port, pd, err := portDir(dir, "redis", port)
	if err != nil {
		return nil, err
	}
	args := append([]string{"--port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", pd,
		"--save", "", "--appendonly", "no", "--logfile", filepath.Join(pd, "redis.log")}, extra...)
	p := &Proc{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: pd, args: args}
	return p, p.Start()
}

// portDir returns port (a free one when 0) and the directory
// dir/<kind>-<port> it made for the process's files.
func portDir(dir, kind string, port int) (int, string, error) {
	if port == 0 {
		var err error
		if port, err = FreePort(); err != nil {
			return 0, "", err
		}
	}
	pd := filepath.Join(dir, kind+"-"+strconv.Itoa(port))
	if err := os.MkdirAll(pd, 0o755); err != nil {
		return 0, "", fmt.Errorf("%s dir: %w", kind, err)
	}
	return port, pd, nil
}

// StartSentinel starts a sentinel on a free port watching master (name) at
// masterAddr with quorum 1, declaring it down after downAfter.
func StartSentinel(dir, name, masterAddr string, downAfter time.Duration) (*Proc, error) {
	port, pd, err := portDir(dir, "sentinel", 0)
	if err != nil {
		return nil, err
	}
	host, mport, _ := net.SplitHostPort(masterAddr)
	conf := fmt.Sprintf("port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\nsentinel monitor %s %s %s 1\n"+
		"sentinel down-after-milliseconds %s %d\nsentinel failover-timeout %s 5000\nsentinel parallel-syncs %s 1\n",
		port, pd, filepath.Join(pd, "sentinel.log"), name, host, mport, name, downAfter.Milliseconds(), name, name)
	cf := filepath.Join(pd, "sentinel.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o644); err != nil {
		return nil, fmt.Errorf("sentinel config: %w", err)
	}
	p := &Proc{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: pd, args: []string{cf, "--sentinel"}}
	return p, p.Start()
}

// Start (re)starts the process with its arguments and waits for PING.
func (p *Proc) Start() error {
	return p.startAndPing(&redis.Options{Addr: p.Addr, DialTimeout: 200 * time.Millisecond, MaxRetries: -1}, 200*time.Millisecond)
}

// launch starts the process with its arguments, in a process group of its own.
func (p *Proc) launch() error {
	p.cmd = exec.Command("redis-server", p.args...)
	p.cmd.SysProcAttr = &syscall.SysProcAttr{Setpgid: true}
	if err := p.cmd.Start(); err != nil {
		return fmt.Errorf("start redis-server on %s: %w", p.Addr, err)
	}
	return nil
}

// startAndPing launches the process and waits up to 10 s until a client
// with o gets an answer to PING (each within pingTimeout); it kills the
// process when none came.
func (p *Proc) startAndPing(o *redis.Options, pingTimeout time.Duration) error {
	if err := p.launch(); err != nil {
		return err
	}
	c := redis.NewClient(o)
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), pingTimeout)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return nil
		}
		if time.Now().After(deadline) {
			p.Kill()
			return fmt.Errorf("redis-server on %s did not answer: %w", p.Addr, err)
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// Kill sends SIGKILL and reaps the process.
func (p *Proc) Kill() {
	if p.cmd == nil || p.cmd.Process == nil {
		return
	}
	_ = p.cmd.Process.Kill()
	_, _ = p.cmd.Process.Wait()
	p.cmd = nil
}

// Client is a plain client of this one process.
func (p *Proc) Client() *redis.Client {
	return redis.NewClient(&redis.Options{Addr: p.Addr, DialTimeout: time.Second})
}

// Cluster is a Redis Cluster of processes started by StartCluster.
type Cluster struct {
	Nodes []*Proc // masters first, then replicas, as created
}

// Addrs lists every node's address.
func (c *Cluster) Addrs() []string {
	out := make([]string, len(c.Nodes))
	for i, n := range c.Nodes {
		out[i] = n.Addr
	}
	return out
}

// Kill kills every node still running.
func (c *Cluster) Kill() {
	for _, n := range c.Nodes {
		n.Kill()
	}
}

// waitNodes asks every node with read, every interval, until ok holds for
// its answer; past the deadline it returns an error naming the node, what
// it waited for (what) and its last answer.
func (c *Cluster) waitNodes(deadline time.Time, every time.Duration, what string, read func(*redis.Client) (string, error), ok func(string) bool) error {
	for _, n := range c.Nodes {
		cl := n.Client()
		for {
			info, err := read(cl)
			if err == nil && ok(info) {
				break
			}
			if time.Now().After(deadline) {
				cl.Close()
				return fmt.Errorf("cluster node %s %s: %w %s", n.Addr, what, err, info)
			}
			time.Sleep(every)
		}
		cl.Close()
	}
	return nil
}

// StartCluster starts masters × (1 + replicas) nodes with a cluster node
// timeout of nodeTimeout and joins them with `redis-cli --cluster create …
// --cluster-replicas n`; it returns once every node reports cluster_state:ok.
func StartCluster(dir string, masters, replicas int, nodeTimeout time.Duration) (*Cluster, error) {
	c := &Cluster{}
	for range masters * (1 + replicas) {
		p, err := StartProc(dir, 0, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", strconv.FormatInt(nodeTimeout.Milliseconds(), 10),
			// As docs/operations.md asks of production clusters: the other
			// masters keep serving while one has no master (else every key
			// answers CLUSTERDOWN until the replica is promoted).
			"--cluster-require-full-coverage", "no")
		if err != nil {
			c.Kill()
			return nil, err
		}
		c.Nodes = append(c.Nodes, p)
	}
	args := append([]string{"--cluster", "create"}, c.Addrs()...)
	args = append(args, "--cluster-replicas", strconv.Itoa(replicas), "--cluster-yes")
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		c.Kill()
		return nil, fmt.Errorf("redis-cli --cluster create: %w: %s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	if err := c.waitNodes(deadline, 100*time.Millisecond, "not ok", func(cl *redis.Client) (string, error) {
		return cl.ClusterInfo(context.Background()).Result()
	}, func(info string) bool { return strings.Contains(info, "cluster_state:ok") }); err != nil {
		c.Kill()
		return nil, err
	}
	// A replica that never finished its first sync refuses to fail over
	// ("disconnected from master for longer than allowed"), so a test that
	// kills a master at once would wait for ever: wait for every link.
	if err := c.waitNodes(deadline, 50*time.Millisecond, "never synced", func(cl *redis.Client) (string, error) {
		return cl.Info(context.Background(), "replication").Result()
	}, func(info string) bool {
		return strings.Contains(info, "role:master") || strings.Contains(info, "master_link_status:up")
	}); err != nil {
		c.Kill()
		return nil, err
	}
	return c, nil
}

// NewProc is StartProc for a test: its directory is temporary and the
// process is killed when the test ends.
func NewProc(t testing.TB, extra ...string) *Proc {
	t.Helper()
	return forTest(t, "redis-server (apt-get install redis-server)", func(dir string) (*Proc, error) { return StartProc(dir, 0, extra...) })
}

// NewCluster is StartCluster for a test.
func NewCluster(t testing.TB, masters, replicas int, nodeTimeout time.Duration) *Cluster {
	t.Helper()
	return forTest(t, "redis cluster", func(dir string) (*Cluster, error) { return StartCluster(dir, masters, replicas, nodeTimeout) })
}

// NewSentinel is StartSentinel for a test.
func NewSentinel(t testing.TB, name, masterAddr string, downAfter time.Duration) *Proc {
	t.Helper()
	return forTest(t, "sentinel", func(dir string) (*Proc, error) { return StartSentinel(dir, name, masterAddr, downAfter) })
}

// forTest starts processes in a temporary directory of t with start, fails
// t when they cannot start (what names them) and kills them when t ends.
func forTest[P interface{ Kill() }](t testing.TB, what string, start func(dir string) (P, error)) P {
	t.Helper()
	p, err := start(t.TempDir())
	if err != nil {
		t.Fatalf("%s: %v", what, err)
	}
	t.Cleanup(p.Kill)
	return p
}

// SecureOptions configure NewSecure.
type SecureOptions struct {
	// CA signs the server's certificate and, with ClientCerts, is the CA
	// client certificates must chain to.
	CA *tlstest.CA
	// ClientCerts makes the server require a client certificate (mutual TLS).
	ClientCerts bool
	// Users are ACL users (name → password) allowed every command and key;
	// the default user is off, so nothing works without AUTH.
	Users map[string]string
	// Extra are more redis-server arguments (cluster mode, say).
	Extra []string
}

// tlsConfig is a client configuration that trusts o.CA (and presents a
// client certificate when the server asks for one).
func (o SecureOptions) tlsConfig() *tls.Config {
	tc := &tls.Config{RootCAs: o.CA.Pool(), MinVersion: tls.VersionTLS12}
	if o.ClientCerts {
		tc.Certificates = []tls.Certificate{o.CA.Client("redistest").TLS}
	}
	return tc
}

// anyUser is one of o.Users.
func (o SecureOptions) anyUser() (user, pass string) {
	for u, p := range o.Users {
		return u, p
	}
	return "", ""
}

// NewSecure starts a redis-server for a test that listens only with TLS on
// a free loopback port, with the ACL users of o, and kills it when the test
// ends. ReadyUser (any of o.Users) is used to wait until it answers.
func NewSecure(t testing.TB, o SecureOptions) *Proc {
	t.Helper()
	port, pd, err := portDir(t.TempDir(), "redis-tls", 0)
	if err != nil {
		t.Fatal(err)
	}
	server := o.CA.Server("redis-" + strconv.Itoa(port))
	auth := "no"
	if o.ClientCerts {
		auth = "yes"
	}
	args := []string{"--port", "0", "--tls-port", strconv.Itoa(port), "--bind", "127.0.0.1", "--dir", pd,
		"--save", "", "--appendonly", "no", "--logfile", filepath.Join(pd, "redis.log"),
		"--tls-cert-file", server.CertFile, "--tls-key-file", server.KeyFile, "--tls-ca-cert-file", o.CA.CertFile,
		"--tls-auth-clients", auth, "--user", "default", "off"}
	for u, pw := range o.Users {
		// One argument per word: redis-server quotes an argument holding spaces.
		args = append(args, "--user", u, "on", ">"+pw, "~*", "&*", "+@all")
	}
	for _, a := range o.Extra {
		if a == "--cluster-enabled" {
			// With no plaintext port the bus port is not tls-port + 10000 by
			// itself; FreePort checked that one is free.
			args = append(args, "--cluster-port", strconv.Itoa(port+10000))
		}
	}
	args = append(args, o.Extra...)
	user, pass := o.anyUser()
	p := &Proc{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: pd, args: args}
	t.Cleanup(p.Kill)
	err = p.startAndPing(&redis.Options{Addr: p.Addr, Username: user, Password: pass, TLSConfig: o.tlsConfig(),
		DialTimeout: 200 * time.Millisecond, MaxRetries: -1}, 500*time.Millisecond)
	if err != nil {
		log, _ := os.ReadFile(filepath.Join(pd, "redis.log"))
		t.Fatalf("redis-server with TLS (apt-get install redis-server): %v\n%s", err, log)
	}
	return p
}

// NewSecureCluster starts a Redis Cluster of masters nodes (no replicas)
// that speak only TLS, on the cluster bus too, with the ACL users of o; it
// returns once every node reports cluster_state:ok.
func NewSecureCluster(t testing.TB, o SecureOptions, masters int) []*Proc {
	t.Helper()
	o.Extra = append(o.Extra, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
		"--tls-cluster", "yes", "--tls-replication", "yes")
	var nodes []*Proc
	args := []string{"--tls", "--cacert", o.CA.CertFile, "--cluster", "create"}
	for range masters {
		n := NewSecure(t, o)
		nodes = append(nodes, n)
		args = append(args, n.Addr)
	}
	user, pass := o.anyUser()
	args = append(args, "--cluster-replicas", "0", "--cluster-yes", "--user", user, "--pass", pass, "--no-auth-warning")
	if o.ClientCerts {
		cl := o.CA.Client("redis-cli")
		args = append(args, "--cert", cl.CertFile, "--key", cl.KeyFile)
	}
	if out, err := exec.Command("redis-cli", args...).CombinedOutput(); err != nil {
		t.Fatalf("redis-cli --cluster create --tls: %v: %s", err, out)
	}
	deadline := time.Now().Add(30 * time.Second)
	for _, n := range nodes {
		c := redis.NewClient(&redis.Options{Addr: n.Addr, Username: user, Password: pass, TLSConfig: o.tlsConfig(), DialTimeout: time.Second})
		for {
			info, err := c.ClusterInfo(context.Background()).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") {
				break
			}
			if time.Now().After(deadline) {
				_ = c.Close()
				t.Fatalf("cluster node %s not ok: %v %s", n.Addr, err, info)
			}
			time.Sleep(100 * time.Millisecond)
		}
		_ = c.Close()
	}
	return nodes
}

// NewSecureSentinel starts a sentinel that speaks only TLS, requires
// password (its own requirepass), and watches master (name) — a NewSecure
// server of o, without client certificates — over TLS as one of o.Users.
// It returns once the sentinel names the master.
func NewSecureSentinel(t testing.TB, o SecureOptions, name string, master *Proc, password string) *Proc {
	t.Helper()
	port, pd, err := portDir(t.TempDir(), "sentinel-tls", 0)
	if err != nil {
		t.Fatal(err)
	}
	server := o.CA.Server("sentinel-" + strconv.Itoa(port))
	user, pass := o.anyUser()
	host, mport, _ := net.SplitHostPort(master.Addr)
	conf := fmt.Sprintf("port 0\ntls-port %d\nbind 127.0.0.1\ndir %s\nlogfile %s\n"+
		"tls-cert-file %s\ntls-key-file %s\ntls-ca-cert-file %s\ntls-auth-clients no\ntls-replication yes\n"+
		"requirepass %s\nsentinel monitor %s %s %s 1\nsentinel auth-user %s %s\nsentinel auth-pass %s %s\n"+
		"sentinel down-after-milliseconds %s 5000\n",
		port, pd, filepath.Join(pd, "sentinel.log"), server.CertFile, server.KeyFile, o.CA.CertFile,
		password, name, host, mport, name, user, name, pass, name)
	cf := filepath.Join(pd, "sentinel.conf")
	if err := os.WriteFile(cf, []byte(conf), 0o600); err != nil {
		t.Fatal(err)
	}
	p := &Proc{Addr: "127.0.0.1:" + strconv.Itoa(port), Port: port, Dir: pd, args: []string{cf, "--sentinel"}}
	if err := p.launch(); err != nil {
		t.Fatalf("sentinel with TLS: %v", err)
	}
	t.Cleanup(p.Kill)
	c := redis.NewSentinelClient(&redis.Options{Addr: p.Addr, Password: password, TLSConfig: o.tlsConfig(), DialTimeout: 200 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(15 * time.Second)
	for {
		addr, err := c.GetMasterAddrByName(context.Background(), name).Result()
		if err == nil && len(addr) == 2 && net.JoinHostPort(addr[0], addr[1]) == master.Addr {
			return p
		}
		if time.Now().After(deadline) {
			log, _ := os.ReadFile(filepath.Join(pd, "sentinel.log"))
			t.Fatalf("sentinel with TLS on %s does not name %s: %v %v\n%s", p.Addr, master.Addr, addr, err, log)
		}
		time.Sleep(50 * time.Millisecond)
	}
}
