// Command floodgate-broker runs the local Kafka-wire-protocol broker of the
// Floodgate stack: a kfake cluster (github.com/twmb/franz-go/pkg/kfake) that
// listens on loopback, persists topics, data and committed offsets under a
// data directory, and never creates topics on its own (topics come from
// migrations, as in production).
//
//	floodgate-broker -port 9092 -data-dir .local/data/kafka        # serve
//	floodgate-broker -check 127.0.0.1:9092                         # health check
//
// Every flag has an environment variable (FLOODGATE_BROKER_*, shown in -help);
// a flag given on the command line wins over its variable.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"log/slog"
	"net"
	"os"
	"os/signal"
	"runtime/debug"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/twmb/franz-go/pkg/kfake"
	"github.com/twmb/franz-go/pkg/kgo"
	"github.com/twmb/franz-go/pkg/kmsg"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest/sessionkeeper"
)

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	defer stop()
	if err := run(ctx, os.Args[1:], os.Getenv, os.Stdout, os.Stderr); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return
		}
		slog.New(slog.NewTextHandler(os.Stderr, nil)).Error("floodgate-broker", "err", err)
		os.Exit(1)
	}
}

// config is the broker's whole configuration, parsed from flags and env.
type config struct {
	Port              int
	Brokers           int
	DataDir           string
	Sync              bool
	ClusterID         string
	Partitions        int
	MinSessionTimeout time.Duration
	MaxSessionTimeout time.Duration
	CloseTimeout      time.Duration
	LogLevel          slog.Level

	Check        string // non-empty: health-check this address and exit
	CheckTimeout time.Duration
	Version      bool
}

// Validate checks each field and how the fields relate.
func (c config) Validate() error {
	switch {
	case c.Check != "":
		if _, _, err := net.SplitHostPort(c.Check); err != nil {
			return fmt.Errorf("-check %q: want host:port: %w", c.Check, err)
		}
		if c.CheckTimeout <= 0 {
			return fmt.Errorf("-check-timeout %v: must be > 0", c.CheckTimeout)
		}
		return nil
	case c.Brokers < 1 || c.Brokers > 16:
		return fmt.Errorf("-brokers %d: must be 1..16", c.Brokers)
	case c.Port < 1 || c.Port+c.Brokers-1 > 65535:
		return fmt.Errorf("-port %d with -brokers %d: ports must lie in 1..65535", c.Port, c.Brokers)
	case c.Partitions < 1:
		return fmt.Errorf("-partitions %d: must be >= 1", c.Partitions)
	case c.MinSessionTimeout <= 0 || c.MaxSessionTimeout < c.MinSessionTimeout:
		return fmt.Errorf("-group-min-session-timeout %v, -group-max-session-timeout %v: need 0 < min <= max",
			c.MinSessionTimeout, c.MaxSessionTimeout)
	case c.Sync && c.DataDir == "":
		return errors.New("-sync needs -data-dir (an in-memory broker has nothing to fsync)")
	case c.CloseTimeout <= 0:
		return fmt.Errorf("-close-timeout %v: must be > 0", c.CloseTimeout)
	}
	return nil
}

func parseConfig(args []string, getenv func(string) string, stderr io.Writer) (config, error) {
	env := func(name, def string) string {
		if v := getenv("FLOODGATE_BROKER_" + name); v != "" {
			return v
		}
		return def
	}
	var (
		c        config
		logLevel string
		fs       = flag.NewFlagSet("floodgate-broker", flag.ContinueOnError)
		envErr   error
	)
	envInt := func(name string, def int) int {
		v, err := strconv.Atoi(env(name, strconv.Itoa(def)))
		if err != nil {
			envErr = errors.Join(envErr, fmt.Errorf("FLOODGATE_BROKER_%s: %w", name, err))
		}
		return v
	}
	envDur := func(name string, def time.Duration) time.Duration {
		v, err := time.ParseDuration(env(name, def.String()))
		if err != nil {
			envErr = errors.Join(envErr, fmt.Errorf("FLOODGATE_BROKER_%s: %w", name, err))
		}
		return v
	}
	envBool := func(name string) bool {
		v, err := strconv.ParseBool(env(name, "false"))
		if err != nil {
			envErr = errors.Join(envErr, fmt.Errorf("FLOODGATE_BROKER_%s: %w", name, err))
		}
		return v
	}
	fs.SetOutput(stderr)
	fs.IntVar(&c.Port, "port", envInt("PORT", 9092), "first listen port on 127.0.0.1; broker i listens on port+i (env FLOODGATE_BROKER_PORT)")
	fs.IntVar(&c.Brokers, "brokers", envInt("BROKERS", 1), "number of brokers, on consecutive ports (env FLOODGATE_BROKER_BROKERS)")
	fs.StringVar(&c.DataDir, "data-dir", env("DATA_DIR", ""), "persist topics, data and offsets here; empty keeps everything in memory (env FLOODGATE_BROKER_DATA_DIR)")
	fs.BoolVar(&c.Sync, "sync", envBool("SYNC"), "fsync every acknowledged produce (env FLOODGATE_BROKER_SYNC)")
	fs.StringVar(&c.ClusterID, "cluster-id", env("CLUSTER_ID", "floodgate-local"), "cluster id for a new data dir; a persisted one keeps its own (env FLOODGATE_BROKER_CLUSTER_ID)")
	fs.IntVar(&c.Partitions, "partitions", envInt("PARTITIONS", 10), "partitions for CreateTopics that asks for the default (-1) (env FLOODGATE_BROKER_PARTITIONS)")
	fs.DurationVar(&c.MinSessionTimeout, "group-min-session-timeout", envDur("GROUP_MIN_SESSION_TIMEOUT", time.Second), "smallest consumer-group session timeout accepted (env FLOODGATE_BROKER_GROUP_MIN_SESSION_TIMEOUT)")
	fs.DurationVar(&c.MaxSessionTimeout, "group-max-session-timeout", envDur("GROUP_MAX_SESSION_TIMEOUT", 5*time.Minute), "largest consumer-group session timeout accepted (env FLOODGATE_BROKER_GROUP_MAX_SESSION_TIMEOUT)")
	fs.DurationVar(&c.CloseTimeout, "close-timeout", envDur("CLOSE_TIMEOUT", 30*time.Second), "how long shutdown may take to flush state to disk (env FLOODGATE_BROKER_CLOSE_TIMEOUT)")
	fs.StringVar(&logLevel, "log-level", env("LOG_LEVEL", "info"), "debug (every request), info, warn or error (env FLOODGATE_BROKER_LOG_LEVEL)")
	fs.StringVar(&c.Check, "check", "", "health-check the broker at host:port (ApiVersions + Metadata) and exit")
	fs.DurationVar(&c.CheckTimeout, "check-timeout", 3*time.Second, "deadline for -check")
	fs.BoolVar(&c.Version, "version", false, "print the version and exit")
	if err := fs.Parse(args); err != nil {
		return c, err
	}
	if envErr != nil {
		return c, envErr
	}
	if fs.NArg() > 0 {
		return c, fmt.Errorf("unexpected arguments %q", fs.Args())
	}
	if err := c.LogLevel.UnmarshalText([]byte(logLevel)); err != nil {
		return c, fmt.Errorf("-log-level %q: want debug, info, warn or error", logLevel)
	}
	return c, c.Validate()
}

func run(ctx context.Context, args []string, getenv func(string) string, stdout, stderr io.Writer) error {
	cfg, err := parseConfig(args, getenv, stderr)
	if err != nil {
		return err
	}
	switch {
	case cfg.Version:
		_, err := fmt.Fprintln(stdout, version())
		return err
	case cfg.Check != "":
		return check(ctx, cfg.Check, cfg.CheckTimeout, stdout)
	}
	log := slog.New(slog.NewTextHandler(stderr, &slog.HandlerOptions{Level: cfg.LogLevel}))
	return serve(ctx, cfg, log)
}

// serve runs the cluster until ctx is done, then closes it, which flushes
// persisted state to the data directory.
func serve(ctx context.Context, cfg config, log *slog.Logger) error {
	ports := make([]int, cfg.Brokers)
	for i := range ports {
		ports[i] = cfg.Port + i
	}
	opts := []kfake.Opt{
		kfake.Ports(ports...), // kfake listens on 127.0.0.1:<port>, never on all interfaces
		kfake.ClusterID(cfg.ClusterID),
		kfake.DefaultNumPartitions(cfg.Partitions),
		kfake.GroupMinSessionTimeout(cfg.MinSessionTimeout),
		kfake.GroupMaxSessionTimeout(cfg.MaxSessionTimeout),
		kfake.WithLogger(kfakeLogger{log}),
		// No kfake.AllowAutoTopicCreation: topics exist only when created.
	}
	if cfg.DataDir != "" {
		opts = append(opts, kfake.DataDir(cfg.DataDir))
	}
	if cfg.Sync {
		opts = append(opts, kfake.SyncWrites())
	}
	cluster, err := kfake.NewCluster(opts...)
	if err != nil {
		return fmt.Errorf("start cluster on ports %v: %w", ports, err)
	}
	log.Info("broker listening",
		"addrs", strings.Join(cluster.ListenAddrs(), ","),
		"data_dir", cfg.DataDir, "sync", cfg.Sync, "version", version(),
		"group_min_session_timeout", cfg.MinSessionTimeout)

	// Group members kfake never times out are expired by the keeper (see
	// pkg/kafkatest/sessionkeeper), which asks the cluster through a client
	// of its own.
	stopKeeper, err := sessionkeeper.Start(cluster, log, min(time.Second, cfg.MinSessionTimeout/2), kgo.ClientID("floodgate-broker-sessions"))
	if err != nil {
		cluster.Close()
		return err
	}

	<-ctx.Done()
	stopKeeper()
	log.Info("shutting down", "close_timeout", cfg.CloseTimeout)
	done := make(chan struct{})
	go func() {
		cluster.Close()
		close(done)
	}()
	select {
	case <-done:
		log.Info("stopped")
		return nil
	case <-time.After(cfg.CloseTimeout):
		return fmt.Errorf("close cluster: not done after %v", cfg.CloseTimeout)
	}
}

// check does a real Kafka round trip against addr: ApiVersions, then
// Metadata for all topics, both sent to that one broker.
func check(ctx context.Context, addr string, timeout time.Duration, stdout io.Writer) error {
	ctx, cancel := context.WithTimeout(ctx, timeout)
	defer cancel()
	cl, err := kgo.NewClient(kgo.SeedBrokers(addr), kgo.DialTimeout(timeout), kgo.ClientID("floodgate-broker-check"))
	if err != nil {
		return fmt.Errorf("check %s: %w", addr, err)
	}
	defer cl.Close()
	seed := cl.SeedBrokers()[0]

	avReq := kmsg.NewPtrApiVersionsRequest()
	avReq.ClientSoftwareName = "floodgate-broker-check" // v3+ rejects empty names (INVALID_REQUEST)
	avReq.ClientSoftwareVersion = "1"
	av, err := seed.Request(ctx, avReq)
	if err != nil {
		return fmt.Errorf("check %s: api versions: %w", addr, err)
	}
	avr := av.(*kmsg.ApiVersionsResponse)
	if avr.ErrorCode != 0 {
		return fmt.Errorf("check %s: api versions: error code %d", addr, avr.ErrorCode)
	}

	md, err := seed.Request(ctx, kmsg.NewPtrMetadataRequest()) // nil Topics: all topics
	if err != nil {
		return fmt.Errorf("check %s: metadata: %w", addr, err)
	}
	mdr := md.(*kmsg.MetadataResponse)
	if len(mdr.Brokers) == 0 {
		return fmt.Errorf("check %s: metadata lists no brokers", addr)
	}
	clusterID := ""
	if mdr.ClusterID != nil {
		clusterID = *mdr.ClusterID
	}
	_, err = fmt.Fprintf(stdout, "ok addr=%s cluster_id=%s brokers=%d topics=%d api_keys=%d\n",
		addr, clusterID, len(mdr.Brokers), len(mdr.Topics), len(avr.ApiKeys))
	return err
}

// version names this binary and the kfake module it was built from.
func version() string {
	v := "floodgate-broker kfake@unknown"
	info, ok := debug.ReadBuildInfo()
	if !ok {
		return v
	}
	for _, d := range info.Deps {
		if d.Path == "github.com/twmb/franz-go/pkg/kfake" {
			v = "floodgate-broker kfake@" + d.Version
		}
	}
	return v + " " + info.GoVersion
}

// kfakeLogger sends kfake's logs to slog. kfake logs every request at its
// info level, so that maps to slog debug.
type kfakeLogger struct{ log *slog.Logger }

var _ kfake.Logger = kfakeLogger{}

func (l kfakeLogger) Logf(level kfake.LogLevel, msg string, args ...any) {
	var sl slog.Level
	switch level {
	case kfake.LogLevelError:
		sl = slog.LevelError
	case kfake.LogLevelWarn:
		sl = slog.LevelWarn
	case kfake.LogLevelInfo:
		sl = slog.LevelDebug
	case kfake.LogLevelDebug:
		sl = slog.LevelDebug - 4
	default:
		return
	}
	ctx := context.Background()
	if !l.log.Enabled(ctx, sl) {
		return
	}
	l.log.Log(ctx, sl, fmt.Sprintf(msg, args...), "component", "kfake")
}
