package app

import (
	"errors"
	"fmt"
	"net/url"
	"runtime"
	"strings"
	"time"

	"golang.org/x/net/http/httpguts"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/gateway"
	"github.com/floodgate-dev/floodgate/pkg/httpapi"
	"github.com/floodgate-dev/floodgate/pkg/journal"
	"github.com/floodgate-dev/floodgate/pkg/limiter/callers"
	"github.com/floodgate-dev/floodgate/pkg/limiter/envoyrls"
	"github.com/floodgate-dev/floodgate/pkg/rollout"
	"github.com/floodgate-dev/floodgate/pkg/series"
)

// The values of FLOODGATE_LIMITER_ENVOY_KEYS.
const (
	EnvoyKeysFloodgate      = "floodgate"
	EnvoyKeysEnvoyRatelimit = "envoy_ratelimit"
)

// GRPCTLSVars are the gRPC port's TLS variables, envoy ratelimit's
// GRPC_SERVER_TLS_CERT, GRPC_SERVER_TLS_KEY, GRPC_CLIENT_TLS_CACERT and
// GRPC_CLIENT_TLS_SAN.
var GRPCTLSVars = config.ServerTLSVars{Cert: "FLOODGATE_LIMITER_GRPC_TLS_CERT_FILE", Key: "FLOODGATE_LIMITER_GRPC_TLS_KEY_FILE",
	ClientCA: "FLOODGATE_LIMITER_GRPC_TLS_CLIENT_CA_FILE", ClientSAN: "FLOODGATE_LIMITER_GRPC_TLS_CLIENT_NAMES"}

// MaxEnvoyLocalCache bounds FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES:
// about 100 bytes a counter, 100 MiB at most.
const MaxEnvoyLocalCache = 1 << 20

// DefaultGRPCAddr is where Envoy's rate-limit service listens by default.
const DefaultGRPCAddr = "127.0.0.1:8081"

// Config is the limiter's start-up configuration, read from the environment.
type Config struct {
	HTTPAddr string // FLOODGATE_LIMITER_ADDR
	// GRPCAddr serves Envoy's rate-limit service and gRPC health
	// (FLOODGATE_LIMITER_GRPC_ADDR: host:port, or unix:PATH for a unix
	// socket, envoy ratelimit's GRPC_UDS; "off" disables). GRPCAddrSet is
	// false when the variable was unset: then a taken default port is
	// logged, not fatal.
	GRPCAddr    string
	GRPCAddrSet bool
	// DebugAddr serves net/http/pprof (FLOODGATE_LIMITER_DEBUG_ADDR); "" = off.
	DebugAddr  string
	RedisAddrs []string // FLOODGATE_REDIS_ADDRS
	// SentinelMaster and SentinelAddrs put Redis behind Sentinel
	// (FLOODGATE_REDIS_SENTINEL_MASTER, FLOODGATE_REDIS_SENTINEL_ADDRS):
	// the limiter asks the sentinels where the master is and follows a
	// failover; FLOODGATE_REDIS_ADDRS is then unused.
	SentinelMaster  string
	SentinelAddrs   []string
	KafkaBrokers    []string             // FLOODGATE_KAFKA_BROKERS
	KafkaSecurity   config.KafkaSecurity // FLOODGATE_KAFKA_TLS*, FLOODGATE_KAFKA_SASL_* (docs/configuration.md)
	RedisSecurity   config.RedisSecurity // FLOODGATE_REDIS_USERNAME, FLOODGATE_REDIS_PASSWORD, FLOODGATE_REDIS_SENTINEL_*, FLOODGATE_REDIS_TLS*
	DecisionsTopic  string               // FLOODGATE_DECISIONS_TOPIC
	Gateway         string               // FLOODGATE_GATEWAY: names this limiter in decision events
	RulesPath       string               // FLOODGATE_LIMITER_RULES: rules file; "" = the built-in default grid
	PrincipalLimit  int                  // FLOODGATE_LIMITER_PRINCIPAL_LIMIT: with no rules file, one principal bucket of this size for every kind
	PrincipalPeriod time.Duration        // FLOODGATE_LIMITER_PRINCIPAL_PERIOD
	RulesPoll       time.Duration        // FLOODGATE_LIMITER_RULES_POLL: how often the rules file is checked for changes
	RulesTopic      string               // FLOODGATE_RULES_TOPIC: rules versions and rollouts (docs/rollouts.md); "" = the file alone
	RuntimePoll     time.Duration        // FLOODGATE_LIMITER_RUNTIME_POLL: how often scales and overrides are read from Redis
	Shadow          bool                 // FLOODGATE_LIMITER_SHADOW: every rule in shadow mode, whatever the file says
	RedisTimeout    time.Duration        // FLOODGATE_LIMITER_REDIS_TIMEOUT: budget of one check
	BreakerFailures int                  // FLOODGATE_LIMITER_BREAKER_FAILURES: failures within a second (and half of the checks) that open the breaker
	BreakerOpen     time.Duration        // FLOODGATE_LIMITER_BREAKER_OPEN: how long it stays open before probes
	OverLimitCache  int                  // FLOODGATE_LIMITER_OVERLIMIT_CACHE: entries of the local over-limit cache; 0 disables
	RedisBatch      int                  // FLOODGATE_LIMITER_REDIS_BATCH: concurrent checks per pipelined Redis write; 1 disables batching
	series.Influx                        // FLOODGATE_INFLUX_*
	InfluxInterval  time.Duration        // FLOODGATE_LIMITER_INFLUX_INTERVAL: per-scope counts flush; 0 disables
	EventBuffer     int                  // FLOODGATE_LIMITER_EVENT_BUFFER: decision events held while Kafka is slow
	// Proxy puts the limiter in front of an upstream (its reverse-proxy mode):
	// FLOODGATE_LIMITER_PROXY_ADDR ("" = off), _UPSTREAM, _ROUTES ("METHOD /template
	// [resource=type:{param}] [cost=N]" separated by ";"), _TRUSTED (CIDRs whose
	// X-Forwarded-For entries are believed), _KIND_HEADER and _ID_HEADER (where an
	// authenticating layer in front puts the principal), _IDENTITY_TRUSTED (CIDRs
	// of that layer: only its identity headers are believed; empty = none),
	// _ANON_IPV6_PREFIX (bits of an IPv6 address that key an anonymous
	// principal). Decisions are in-process.
	ProxyAddr, ProxyUpstream, ProxyKindHeader, ProxyIDHeader string
	ProxyRoutes                                              []gateway.Route
	ProxyTrusted, ProxyIdentityTrusted                       gateway.TrustedProxies
	ProxyAnonIPv6Prefix                                      int
	// Journal keeps decision events on disk while Kafka is unreachable
	// (FLOODGATE_JOURNAL_*; an empty FLOODGATE_JOURNAL_DIR disables it).
	Journal journal.Config
	// EnvoyConfigDir holds envoy ratelimit configuration files
	// (FLOODGATE_LIMITER_ENVOY_CONFIG, every *.yaml in it); their domains are
	// answered on the gRPC API with envoy ratelimit's semantics. EnvoyShadow
	// is its global shadow switch (FLOODGATE_LIMITER_ENVOY_SHADOW_MODE),
	// EnvoyQuota its global QUOTA_MODE (FLOODGATE_LIMITER_ENVOY_QUOTA_MODE),
	// EnvoyMerge its MERGE_DOMAIN_CONFIG (FLOODGATE_LIMITER_ENVOY_MERGE_DOMAINS).
	EnvoyConfigDir                      string
	EnvoyShadow, EnvoyQuota, EnvoyMerge bool
	// EnvoyFailureModeDeny is Envoy's failure_mode_deny for those domains
	// (FLOODGATE_LIMITER_ENVOY_FAILURE_MODE_DENY): whether a call that fails
	// (Redis unavailable and no fail policy) is denied by Envoy — what its
	// degraded decision event reports.
	EnvoyFailureModeDeny bool
	// EnvoyHeaders adds envoy ratelimit's LIMIT_RESPONSE_HEADERS_ENABLED
	// headers to answers for those domains
	// (FLOODGATE_LIMITER_ENVOY_RESPONSE_HEADERS), named by
	// FLOODGATE_LIMITER_ENVOY_{LIMIT,REMAINING,RESET}_HEADER.
	EnvoyHeaders                                             bool
	EnvoyLimitHeader, EnvoyRemainingHeader, EnvoyResetHeader string
	// EnvoyKeys is how the fixed-window counters of envoy domains are keyed
	// in Redis (FLOODGATE_LIMITER_ENVOY_KEYS): "floodgate", or
	// "envoy_ratelimit" — envoy ratelimit's own keys, starting with
	// EnvoyKeyPrefix (its CACHE_KEY_PREFIX,
	// FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX), so that both count in the
	// same counters while a fleet moves over.
	EnvoyKeys, EnvoyKeyPrefix string
	// EnvoyLocalCache is how many over-limit counters of envoy domains are
	// kept in process until their window ends, answered without Redis
	// (FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES; envoy ratelimit's
	// LOCAL_CACHE_SIZE_IN_BYTES); 0: none.
	EnvoyLocalCache int
	// EnvoyStopIncrement: a call's counters are read first, and a call one
	// of them would deny does not increment the others
	// (FLOODGATE_LIMITER_ENVOY_STOP_INCREMENT_WHEN_OVER_LIMIT; envoy
	// ratelimit's STOP_CACHE_KEY_INCREMENT_WHEN_OVERLIMIT).
	EnvoyStopIncrement bool
	// EnvoyNearLimitRatio is the share of a limit past which its hits count
	// near_limit (FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO; envoy
	// ratelimit's NEAR_LIMIT_RATIO), in (0, 1].
	EnvoyNearLimitRatio float64
	// EnvoyExpirationJitter lengthens each counter's expiry by a random
	// number of seconds below it
	// (FLOODGATE_LIMITER_ENVOY_EXPIRATION_JITTER_MAX_SECONDS; envoy
	// ratelimit's EXPIRATION_JITTER_MAX_SECONDS); 0: none.
	EnvoyExpirationJitter time.Duration
	// GRPCTLS serves the gRPC port over TLS, mutual with a client CA
	// (FLOODGATE_LIMITER_GRPC_TLS_*); nil: plaintext.
	GRPCTLS *config.ServerTLS
	// EnvoyIdentity names the descriptor keys of a call's principal
	// (FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS, "none" = nil), client address
	// (FLOODGATE_LIMITER_ENVOY_IP_KEY) and method
	// (FLOODGATE_LIMITER_ENVOY_METHOD_KEY): with it every call for those
	// domains is a decision event and penalties and scales apply.
	EnvoyIdentity *envoyrls.EnvoyIdentity
	// Auth is who may ask for checks (FLOODGATE_LIMITER_AUTH): "tokens" —
	// the gateways of FLOODGATE_LIMITER_CALLERS, each bound to what it may
	// claim — or "none", anyone who can connect. Unset, it is "none" while
	// the HTTP and gRPC APIs listen on loopback only, and must be chosen
	// otherwise.
	Auth    string
	Callers *callers.Callers
	// IdleTimeout closes idle keep-alive connections (FLOODGATE_LIMITER_IDLE_TIMEOUT);
	// MaxConns bounds the HTTP connections served at once (FLOODGATE_LIMITER_MAX_CONNS).
	IdleTimeout time.Duration
	MaxConns    int
	// HTTPServer is what serves the check API (FLOODGATE_LIMITER_HTTP_SERVER):
	// fasthttp (POST /v1/check natively, every other request through
	// net/http's handlers) or nethttp.
	HTTPServer string
	// CheckTimeout is a check's deadline when its caller names none
	// (FLOODGATE_LIMITER_CHECK_TIMEOUT; 0 = none): no X-Floodgate-Timeout-Ms
	// or X-Envoy-Expected-Rq-Timeout-Ms header, no gRPC deadline.
	CheckTimeout time.Duration
	// GRPCMaxConns bounds the gRPC connections served at once
	// (FLOODGATE_LIMITER_GRPC_MAX_CONNS); GRPCMaxStreams the concurrent
	// streams of one (FLOODGATE_LIMITER_GRPC_MAX_STREAMS).
	GRPCMaxConns   int
	GRPCMaxStreams int
	// GRPCGateMax is the most ShouldRateLimit calls the entry gate lets be
	// decided at once, its adaptive limit's ceiling
	// (FLOODGATE_LIMITER_GRPC_GATE_MAX; default DefaultGRPCGateMax; 0: no
	// gate).
	GRPCGateMax int
	// GRPCGateTarget is the time from the gate to the answer the entry
	// gate's adaptive limit aims at (FLOODGATE_LIMITER_GRPC_GATE_TARGET;
	// default envoyrls.GateTarget, 5ms).
	GRPCGateTarget time.Duration
	// GRPCGatePace paces the gRPC connections' reads by the entry gate's
	// queue, newest first (FLOODGATE_LIMITER_GRPC_GATE_PACE): the floodgate
	// transport and a gate only; unset, on where both are.
	GRPCGatePace bool
	// GRPCTransport is what serves the gRPC port
	// (FLOODGATE_LIMITER_GRPC_TRANSPORT): floodgate (the default),
	// pkg/grpcfast's h2c transport for unary calls, or grpc-go
	// (docs/limiter.md, "The gRPC transport").
	GRPCTransport string
}

// ConfigFromEnv reads the configuration and validates it.
// DefaultGRPCGateMax is the entry gate's ceiling unless
// FLOODGATE_LIMITER_GRPC_GATE_MAX says otherwise: 64 calls decided at once
// per processor the runtime runs on (GOMAXPROCS, which follows a cgroup's
// CPU limit). On one core, 64 with paced reads kept 93–96 % of saturation
// answered within a 50 ms deadline at twice saturation, where no gate
// answered 0–1 % (docs/chaos.md, 2026-12-02 15:06–15:15); the limit adapts
// below the ceiling.
func DefaultGRPCGateMax() int { return min(64*runtime.GOMAXPROCS(0), 100_000) }

func ConfigFromEnv(getenv config.Getenv) (Config, error) {
	e := config.NewEnv(getenv)
	c := Config{
		HTTPAddr:              e.String("FLOODGATE_LIMITER_ADDR", "127.0.0.1:8080"),
		GRPCAddr:              e.String("FLOODGATE_LIMITER_GRPC_ADDR", DefaultGRPCAddr),
		GRPCAddrSet:           e.String("FLOODGATE_LIMITER_GRPC_ADDR", "") != "",
		DebugAddr:             e.String("FLOODGATE_LIMITER_DEBUG_ADDR", ""),
		RedisAddrs:            e.List("FLOODGATE_REDIS_ADDRS", config.DefaultRedisAddrs),
		SentinelMaster:        e.String("FLOODGATE_REDIS_SENTINEL_MASTER", ""),
		SentinelAddrs:         e.List("FLOODGATE_REDIS_SENTINEL_ADDRS", ""),
		KafkaBrokers:          e.List("FLOODGATE_KAFKA_BROKERS", config.DefaultKafkaBrokers),
		KafkaSecurity:         config.ReadKafkaSecurity(e),
		RedisSecurity:         config.ReadRedisSecurity(e),
		DecisionsTopic:        e.String("FLOODGATE_DECISIONS_TOPIC", config.DefaultDecisionsTopic),
		Gateway:               e.String("FLOODGATE_GATEWAY", "local"),
		RulesPath:             e.String("FLOODGATE_LIMITER_RULES", ""),
		RulesTopic:            e.String("FLOODGATE_RULES_TOPIC", ""),
		EnvoyConfigDir:        e.String("FLOODGATE_LIMITER_ENVOY_CONFIG", ""),
		Auth:                  e.String("FLOODGATE_LIMITER_AUTH", ""),
		IdleTimeout:           e.Duration("FLOODGATE_LIMITER_IDLE_TIMEOUT", time.Minute),
		MaxConns:              e.Int("FLOODGATE_LIMITER_MAX_CONNS", 10000),
		HTTPServer:            e.String("FLOODGATE_LIMITER_HTTP_SERVER", httpapi.TransportFastHTTP),
		CheckTimeout:          e.Duration("FLOODGATE_LIMITER_CHECK_TIMEOUT", time.Second),
		GRPCMaxConns:          e.Int("FLOODGATE_LIMITER_GRPC_MAX_CONNS", 10000),
		GRPCMaxStreams:        e.Int("FLOODGATE_LIMITER_GRPC_MAX_STREAMS", envoyrls.MaxGRPCStreams),
		GRPCGateMax:           e.Int("FLOODGATE_LIMITER_GRPC_GATE_MAX", DefaultGRPCGateMax()),
		GRPCGateTarget:        e.Duration("FLOODGATE_LIMITER_GRPC_GATE_TARGET", envoyrls.GateTarget),
		GRPCTransport:         e.String("FLOODGATE_LIMITER_GRPC_TRANSPORT", envoyrls.TransportFloodgate),
		EnvoyShadow:           e.Bool("FLOODGATE_LIMITER_ENVOY_SHADOW_MODE", false),
		EnvoyQuota:            e.Bool("FLOODGATE_LIMITER_ENVOY_QUOTA_MODE", false),
		EnvoyMerge:            e.Bool("FLOODGATE_LIMITER_ENVOY_MERGE_DOMAINS", false),
		EnvoyFailureModeDeny:  e.Bool("FLOODGATE_LIMITER_ENVOY_FAILURE_MODE_DENY", false),
		EnvoyHeaders:          e.Bool("FLOODGATE_LIMITER_ENVOY_RESPONSE_HEADERS", false),
		EnvoyLimitHeader:      e.String("FLOODGATE_LIMITER_ENVOY_LIMIT_HEADER", "RateLimit-Limit"),
		EnvoyRemainingHeader:  e.String("FLOODGATE_LIMITER_ENVOY_REMAINING_HEADER", "RateLimit-Remaining"),
		EnvoyResetHeader:      e.String("FLOODGATE_LIMITER_ENVOY_RESET_HEADER", "RateLimit-Reset"),
		EnvoyKeys:             e.String("FLOODGATE_LIMITER_ENVOY_KEYS", EnvoyKeysFloodgate),
		EnvoyKeyPrefix:        e.String("FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX", ""),
		EnvoyLocalCache:       e.Int("FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES", 0),
		EnvoyStopIncrement:    e.Bool("FLOODGATE_LIMITER_ENVOY_STOP_INCREMENT_WHEN_OVER_LIMIT", false),
		EnvoyNearLimitRatio:   e.Float("FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO", envoyrls.DefaultNearLimitRatio),
		EnvoyExpirationJitter: time.Duration(e.Int("FLOODGATE_LIMITER_ENVOY_EXPIRATION_JITTER_MAX_SECONDS", 0)) * time.Second,
		PrincipalLimit:        e.Int("FLOODGATE_LIMITER_PRINCIPAL_LIMIT", 0),
		PrincipalPeriod:       e.Duration("FLOODGATE_LIMITER_PRINCIPAL_PERIOD", time.Second),
		RulesPoll:             e.Duration("FLOODGATE_LIMITER_RULES_POLL", time.Second),
		RuntimePoll:           e.Duration("FLOODGATE_LIMITER_RUNTIME_POLL", time.Second),
		Shadow:                e.Bool("FLOODGATE_LIMITER_SHADOW", false),
		RedisTimeout:          e.Duration("FLOODGATE_LIMITER_REDIS_TIMEOUT", 50*time.Millisecond),
		BreakerFailures:       e.Int("FLOODGATE_LIMITER_BREAKER_FAILURES", 10),
		BreakerOpen:           e.Duration("FLOODGATE_LIMITER_BREAKER_OPEN", 200*time.Millisecond),
		OverLimitCache:        e.Int("FLOODGATE_LIMITER_OVERLIMIT_CACHE", 100_000),
		RedisBatch:            e.Int("FLOODGATE_LIMITER_REDIS_BATCH", 64),
		Influx:                series.ReadInflux(e),
		InfluxInterval:        e.Duration("FLOODGATE_LIMITER_INFLUX_INTERVAL", 5*time.Second),
		EventBuffer:           e.Int("FLOODGATE_LIMITER_EVENT_BUFFER", 65536),
	}
	c.GRPCGatePace = e.Bool("FLOODGATE_LIMITER_GRPC_GATE_PACE", c.GRPCGateMax > 0 && c.GRPCTransport == envoyrls.TransportFloodgate)
	var ierr error
	c.EnvoyIdentity, ierr = envoyIdentity(e)
	c.ProxyAddr = e.String("FLOODGATE_LIMITER_PROXY_ADDR", "")
	c.ProxyUpstream = e.String("FLOODGATE_LIMITER_PROXY_UPSTREAM", "")
	c.ProxyKindHeader = e.String("FLOODGATE_LIMITER_PROXY_KIND_HEADER", "X-Principal-Kind")
	c.ProxyIDHeader = e.String("FLOODGATE_LIMITER_PROXY_ID_HEADER", "X-Principal-Id")
	var perr []error
	for _, line := range strings.Split(e.String("FLOODGATE_LIMITER_PROXY_ROUTES", ""), ";") {
		if line = strings.TrimSpace(line); line == "" {
			continue
		}
		rt, err := gateway.ParseRoute(line)
		if err != nil {
			perr = append(perr, fmt.Errorf("FLOODGATE_LIMITER_PROXY_ROUTES: %w", err))
		}
		c.ProxyRoutes = append(c.ProxyRoutes, rt)
	}
	trusted, err := gateway.ParseTrustedProxies(e.List("FLOODGATE_LIMITER_PROXY_TRUSTED", ""))
	if err != nil {
		perr = append(perr, fmt.Errorf("FLOODGATE_LIMITER_PROXY_TRUSTED: %w", err))
	}
	c.ProxyTrusted = trusted
	identity, err := gateway.ParseTrustedProxies(e.List("FLOODGATE_LIMITER_PROXY_IDENTITY_TRUSTED", ""))
	if err != nil {
		perr = append(perr, fmt.Errorf("FLOODGATE_LIMITER_PROXY_IDENTITY_TRUSTED: %w", err))
	}
	c.ProxyIdentityTrusted = identity
	c.ProxyAnonIPv6Prefix = e.Int("FLOODGATE_LIMITER_PROXY_ANON_IPV6_PREFIX", 64)
	callersSpec := e.Secret("FLOODGATE_LIMITER_CALLERS", "FLOODGATE_LIMITER_CALLERS_FILE")
	c.GRPCTLS = e.ServerTLS(GRPCTLSVars, "h2")
	jc, jerr := journal.ConfigFromEnv(getenv)
	if err := errors.Join(append(perr, e.Err(), jerr, ierr)...); err != nil {
		return Config{}, err
	}
	c.Journal = jc
	if spec := callersSpec.Reveal(); spec != "" {
		callers, err := callers.ParseCallers(spec)
		if err != nil {
			return Config{}, fmt.Errorf("FLOODGATE_LIMITER_CALLERS (or its _FILE): %w", err)
		}
		c.Callers = callers
	}
	if c.Auth == "" && config.LoopbackOnly(c.HTTPAddr, c.GRPCAddr) {
		c.Auth = "none"
	}
	return c, c.Validate()
}

// Validate checks ranges and how fields relate; errors name the variable.
func (c Config) Validate() error {
	var v config.Check
	v.Require(c.IdleTimeout >= 10*time.Millisecond && c.IdleTimeout <= time.Hour, "FLOODGATE_LIMITER_IDLE_TIMEOUT", "%s: must be in 10ms..1h", c.IdleTimeout)
	v.Require(c.MaxConns >= 1 && c.MaxConns <= 1_000_000, "FLOODGATE_LIMITER_MAX_CONNS", "%d: must be in 1..1000000", c.MaxConns)
	v.Require(c.HTTPServer == httpapi.TransportFastHTTP || c.HTTPServer == httpapi.TransportNetHTTP, "FLOODGATE_LIMITER_HTTP_SERVER",
		"%q: must be %s or %s", c.HTTPServer, httpapi.TransportFastHTTP, httpapi.TransportNetHTTP)
	v.Require(c.CheckTimeout == 0 || (c.CheckTimeout >= time.Millisecond && c.CheckTimeout <= time.Minute), "FLOODGATE_LIMITER_CHECK_TIMEOUT", "%s: must be 0 (none) or in 1ms..1m", c.CheckTimeout)
	v.Require(c.GRPCMaxConns >= 1 && c.GRPCMaxConns <= 1_000_000, "FLOODGATE_LIMITER_GRPC_MAX_CONNS", "%d: must be in 1..1000000", c.GRPCMaxConns)
	v.Require(c.GRPCGateMax == 0 || c.GRPCGateMax >= envoyrls.GateMin && c.GRPCGateMax <= 100_000, "FLOODGATE_LIMITER_GRPC_GATE_MAX",
		"%d: must be 0 (no gate) or in %d..100000", c.GRPCGateMax, envoyrls.GateMin)
	v.Require(c.GRPCGateTarget >= envoyrls.GateTargetMin && c.GRPCGateTarget <= envoyrls.GateTargetMax, "FLOODGATE_LIMITER_GRPC_GATE_TARGET",
		"%s: must be in %s..%s", c.GRPCGateTarget, envoyrls.GateTargetMin, envoyrls.GateTargetMax)
	v.Require(envoyrls.ValidTransport(c.GRPCTransport), "FLOODGATE_LIMITER_GRPC_TRANSPORT", "%q: must be grpc-go or floodgate", c.GRPCTransport)
	v.Require(!c.GRPCGatePace || c.GRPCGateMax > 0 && c.GRPCTransport == envoyrls.TransportFloodgate, "FLOODGATE_LIMITER_GRPC_GATE_PACE",
		"true: needs FLOODGATE_LIMITER_GRPC_GATE_MAX > 0 and FLOODGATE_LIMITER_GRPC_TRANSPORT=%s (got %d and %q)", envoyrls.TransportFloodgate, c.GRPCGateMax, c.GRPCTransport)
	v.Require(c.GRPCMaxStreams >= 1 && c.GRPCMaxStreams <= 100_000, "FLOODGATE_LIMITER_GRPC_MAX_STREAMS", "%d: must be in 1..100000", c.GRPCMaxStreams)
	switch c.Auth {
	case "none":
	case "tokens":
		v.Require(c.Callers != nil, "FLOODGATE_LIMITER_CALLERS", "required with FLOODGATE_LIMITER_AUTH=tokens: name:gateway:sha256hex[:max_cost[:kind+kind[:id+id[:route+route]]]], …")
	case "":
		v.Require(false, "FLOODGATE_LIMITER_AUTH", "the limiter listens beyond loopback (%s, %s): choose tokens (gateways in FLOODGATE_LIMITER_CALLERS) or none (anyone who can connect may name any principal)", c.HTTPAddr, c.GRPCAddr)
	default:
		v.Require(false, "FLOODGATE_LIMITER_AUTH", "%q is not one of tokens|none", c.Auth)
	}
	if c.Auth == "none" && c.Callers != nil {
		v.Require(false, "FLOODGATE_LIMITER_CALLERS", "set, but FLOODGATE_LIMITER_AUTH is none: set FLOODGATE_LIMITER_AUTH=tokens")
	}
	v.Require(c.HTTPAddr != "", "FLOODGATE_LIMITER_ADDR", "required")
	v.Require(c.GRPCAddr != "" && c.GRPCAddr != c.HTTPAddr, "FLOODGATE_LIMITER_GRPC_ADDR", "host:port other than FLOODGATE_LIMITER_ADDR, unix:PATH (a unix socket), or off")
	v.Require(c.GRPCTLS == nil || c.GRPCAddr != "off", GRPCTLSVars.Cert, "set, but FLOODGATE_LIMITER_GRPC_ADDR is off")
	v.Require(c.DebugAddr == "" || (c.DebugAddr != c.HTTPAddr && c.DebugAddr != c.GRPCAddr), "FLOODGATE_LIMITER_DEBUG_ADDR", "host:port other than the HTTP and gRPC addresses, or unset")
	v.Require(len(c.RedisAddrs) > 0, "FLOODGATE_REDIS_ADDRS", "at least one host:port")
	v.Require(c.SentinelMaster == "" || len(c.SentinelAddrs) > 0, "FLOODGATE_REDIS_SENTINEL_ADDRS", "at least one host:port is required with FLOODGATE_REDIS_SENTINEL_MASTER")
	v.Require(c.SentinelMaster != "" || len(c.SentinelAddrs) == 0, "FLOODGATE_REDIS_SENTINEL_MASTER", "required with FLOODGATE_REDIS_SENTINEL_ADDRS")
	v.Require(len(c.KafkaBrokers) > 0, "FLOODGATE_KAFKA_BROKERS", "at least one host:port")
	v.Require(c.DecisionsTopic != "", "FLOODGATE_DECISIONS_TOPIC", "required")
	for _, h := range []struct{ name, v string }{{"FLOODGATE_LIMITER_ENVOY_LIMIT_HEADER", c.EnvoyLimitHeader},
		{"FLOODGATE_LIMITER_ENVOY_REMAINING_HEADER", c.EnvoyRemainingHeader}, {"FLOODGATE_LIMITER_ENVOY_RESET_HEADER", c.EnvoyResetHeader}} {
		v.Require(httpguts.ValidHeaderFieldName(h.v), h.name, "%q is not an HTTP header name", h.v)
	}
	v.Require(c.EnvoyKeys == EnvoyKeysFloodgate || c.EnvoyKeys == EnvoyKeysEnvoyRatelimit, "FLOODGATE_LIMITER_ENVOY_KEYS",
		"%q: must be %s or %s", c.EnvoyKeys, EnvoyKeysFloodgate, EnvoyKeysEnvoyRatelimit)
	v.Require(c.EnvoyKeyPrefix == "" || c.EnvoyKeys == EnvoyKeysEnvoyRatelimit, "FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX",
		"set, but FLOODGATE_LIMITER_ENVOY_KEYS is %s: the prefix is envoy ratelimit's CACHE_KEY_PREFIX, for its keys (FLOODGATE_LIMITER_ENVOY_KEYS=%s)", c.EnvoyKeys, EnvoyKeysEnvoyRatelimit)
	v.Require(len(c.EnvoyKeyPrefix) <= 256, "FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX", "%d bytes: at most 256", len(c.EnvoyKeyPrefix))
	v.Require(c.EnvoyExpirationJitter >= 0 && c.EnvoyExpirationJitter <= 24*time.Hour, "FLOODGATE_LIMITER_ENVOY_EXPIRATION_JITTER_MAX_SECONDS",
		"%d: 0 (none) to 86400 seconds", int64(c.EnvoyExpirationJitter/time.Second))
	v.Require(c.EnvoyNearLimitRatio > 0 && c.EnvoyNearLimitRatio <= 1, "FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO", "%v: a share of the limit, in (0, 1]", c.EnvoyNearLimitRatio)
	v.Require(c.EnvoyLocalCache >= 0 && c.EnvoyLocalCache <= MaxEnvoyLocalCache, "FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES",
		"%d: 0 (none) to %d counters", c.EnvoyLocalCache, MaxEnvoyLocalCache)
	v.Require(events.ValidGateway(c.Gateway) == nil, "FLOODGATE_GATEWAY", "%q: 1 to 64 characters of UTF-8 text without control characters (it names this limiter in every decision event)", c.Gateway)
	v.Require(c.PrincipalLimit >= 0, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT", "%d: must be at least 1 (or unset)", c.PrincipalLimit)
	v.Require(c.PrincipalLimit == 0 || c.RulesPath == "", "FLOODGATE_LIMITER_PRINCIPAL_LIMIT", "set together with FLOODGATE_LIMITER_RULES; put the limit in the rules file instead")
	v.Require(c.RulesPoll >= 10*time.Millisecond, "FLOODGATE_LIMITER_RULES_POLL", "%s: must be at least 10ms", c.RulesPoll)
	if c.RulesTopic != "" {
		err := rollout.ValidTopic(c.RulesTopic)
		v.Require(err == nil, "FLOODGATE_RULES_TOPIC", "%v", err)
		v.Require(c.PrincipalLimit == 0, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT", "set together with FLOODGATE_RULES_TOPIC; publish the rules on the topic instead")
	}
	v.Require(c.RuntimePoll >= 10*time.Millisecond, "FLOODGATE_LIMITER_RUNTIME_POLL", "%s: must be at least 10ms", c.RuntimePoll)
	v.Require(c.BreakerFailures >= 1 && c.BreakerFailures <= 1000, "FLOODGATE_LIMITER_BREAKER_FAILURES", "%d: must be in 1..1000", c.BreakerFailures)
	v.Require(c.BreakerOpen >= 10*time.Millisecond && c.BreakerOpen <= time.Minute, "FLOODGATE_LIMITER_BREAKER_OPEN", "%s: must be in 10ms..1m", c.BreakerOpen)
	v.Require(c.RedisBatch >= 1 && c.RedisBatch <= 1024, "FLOODGATE_LIMITER_REDIS_BATCH", "%d: must be in 1..1024", c.RedisBatch)
	v.Require(c.OverLimitCache >= 0, "FLOODGATE_LIMITER_OVERLIMIT_CACHE", "%d: must be 0 (off) or more", c.OverLimitCache)
	v.Require(c.InfluxInterval == 0 || c.InfluxInterval >= 100*time.Millisecond, "FLOODGATE_LIMITER_INFLUX_INTERVAL", "%s: must be 0 (off) or at least 100ms", c.InfluxInterval)
	v.Require(c.InfluxInterval == 0 || c.InfluxURL != "", "FLOODGATE_INFLUX_URL", "required while FLOODGATE_LIMITER_INFLUX_INTERVAL is not 0")
	v.Require(c.PrincipalPeriod >= time.Millisecond, "FLOODGATE_LIMITER_PRINCIPAL_PERIOD", "%s: must be at least 1ms", c.PrincipalPeriod)
	v.Require(c.RedisTimeout >= time.Millisecond && c.RedisTimeout <= 5*time.Second, "FLOODGATE_LIMITER_REDIS_TIMEOUT", "%s: must be in 1ms..5s", c.RedisTimeout)
	v.Require(c.EventBuffer >= 1, "FLOODGATE_LIMITER_EVENT_BUFFER", "%d: must be at least 1", c.EventBuffer)
	if c.ProxyAddr != "" {
		u, err := url.Parse(c.ProxyUpstream)
		v.Require(err == nil && (u.Scheme == "http" || u.Scheme == "https") && u.Host != "", "FLOODGATE_LIMITER_PROXY_UPSTREAM",
			"%q: an http(s) URL is required in proxy mode", c.ProxyUpstream)
		v.Require(c.ProxyAddr != c.HTTPAddr && c.ProxyAddr != c.GRPCAddr, "FLOODGATE_LIMITER_PROXY_ADDR", "must differ from the HTTP and gRPC addresses")
		v.Require(c.ProxyAnonIPv6Prefix >= 1 && c.ProxyAnonIPv6Prefix <= 128, "FLOODGATE_LIMITER_PROXY_ANON_IPV6_PREFIX", "%d: must be in 1..128", c.ProxyAnonIPv6Prefix)
		v.Require(c.ProxyKindHeader != "" && c.ProxyIDHeader != "" && !strings.EqualFold(c.ProxyKindHeader, c.ProxyIDHeader),
			"FLOODGATE_LIMITER_PROXY_ID_HEADER", "%q: must be a header name other than FLOODGATE_LIMITER_PROXY_KIND_HEADER", c.ProxyIDHeader)
	}
	if c.Journal.Dir != "" {
		return errors.Join(v.Err(), c.Journal.Validate())
	}
	return v.Err()
}

// envoyIdentity reads FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS, _IP_KEY and
// _METHOD_KEY; errors name the variable.
func envoyIdentity(e *config.Env) (*envoyrls.EnvoyIdentity, error) {
	spec := e.String("FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS", envoyrls.DefaultEnvoyPrincipalKeys)
	id := &envoyrls.EnvoyIdentity{
		IPKey:     e.String("FLOODGATE_LIMITER_ENVOY_IP_KEY", "remote_address"),
		MethodKey: e.String("FLOODGATE_LIMITER_ENVOY_METHOD_KEY", "method"),
	}
	var errs []error
	for _, k := range []struct{ name, v string }{{"FLOODGATE_LIMITER_ENVOY_IP_KEY", id.IPKey}, {"FLOODGATE_LIMITER_ENVOY_METHOD_KEY", id.MethodKey}} {
		if k.v == "" || len(k.v) > events.MaxEnvoyKeyLen || strings.ContainsAny(k.v, ", =") {
			errs = append(errs, fmt.Errorf("%s: %q: a descriptor key of 1-%d bytes without ',', '=' or spaces", k.name, k.v, events.MaxEnvoyKeyLen))
		}
	}
	if id.IPKey == id.MethodKey {
		errs = append(errs, fmt.Errorf("FLOODGATE_LIMITER_ENVOY_METHOD_KEY: %q is FLOODGATE_LIMITER_ENVOY_IP_KEY too; they must differ", id.MethodKey))
	}
	if strings.TrimSpace(spec) == "none" {
		return nil, errors.Join(errs...)
	}
	keys, err := envoyrls.ParseEnvoyPrincipalKeys(spec, id.IPKey)
	if err != nil {
		errs = append(errs, fmt.Errorf("FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS: %w", err))
	}
	for _, k := range keys {
		if k.Key == id.MethodKey {
			errs = append(errs, fmt.Errorf("FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS: %q is FLOODGATE_LIMITER_ENVOY_METHOD_KEY", k.Key))
		}
	}
	id.Keys = keys
	return id, errors.Join(errs...)
}
