package app

import (
	"runtime"
	"strings"
	"testing"

	"github.com/stretchr/testify/require"
)

func TestConfigFromEnvNamesBadVariables(t *testing.T) {
	cases := []struct {
		name string
		env  map[string]string
		want string
	}{
		{"defaults are valid", map[string]string{}, ""},
		{"limit and rules file together", map[string]string{"FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "50", "FLOODGATE_LIMITER_RULES": "r.yaml"}, "FLOODGATE_LIMITER_PRINCIPAL_LIMIT"},
		{"breaker failures", map[string]string{"FLOODGATE_LIMITER_BREAKER_FAILURES": "0"}, "FLOODGATE_LIMITER_BREAKER_FAILURES"},
		{"breaker open", map[string]string{"FLOODGATE_LIMITER_BREAKER_OPEN": "2h"}, "FLOODGATE_LIMITER_BREAKER_OPEN"},
		{"cache size", map[string]string{"FLOODGATE_LIMITER_OVERLIMIT_CACHE": "-1"}, "FLOODGATE_LIMITER_OVERLIMIT_CACHE"},
		{"shadow not a bool", map[string]string{"FLOODGATE_LIMITER_SHADOW": "maybe"}, "FLOODGATE_LIMITER_SHADOW"},
		{"rules poll", map[string]string{"FLOODGATE_LIMITER_RULES_POLL": "1ms"}, "FLOODGATE_LIMITER_RULES_POLL"},
		{"grpc on the http address", map[string]string{"FLOODGATE_LIMITER_ADDR": "127.0.0.1:9", "FLOODGATE_LIMITER_GRPC_ADDR": "127.0.0.1:9"}, "FLOODGATE_LIMITER_GRPC_ADDR"},
		{"redis batch", map[string]string{"FLOODGATE_LIMITER_REDIS_BATCH": "0"}, "FLOODGATE_LIMITER_REDIS_BATCH"},
		{"check timeout too long", map[string]string{"FLOODGATE_LIMITER_CHECK_TIMEOUT": "2m"}, "FLOODGATE_LIMITER_CHECK_TIMEOUT"},
		{"check timeout not a duration", map[string]string{"FLOODGATE_LIMITER_CHECK_TIMEOUT": "fifty"}, "FLOODGATE_LIMITER_CHECK_TIMEOUT"},
		{"check timeout off", map[string]string{"FLOODGATE_LIMITER_CHECK_TIMEOUT": "0s"}, ""},
		{"grpc connections", map[string]string{"FLOODGATE_LIMITER_GRPC_MAX_CONNS": "0"}, "FLOODGATE_LIMITER_GRPC_MAX_CONNS"},
		{"grpc streams", map[string]string{"FLOODGATE_LIMITER_GRPC_MAX_STREAMS": "0"}, "FLOODGATE_LIMITER_GRPC_MAX_STREAMS"},
		{"grpc gate", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_MAX": "3"}, "FLOODGATE_LIMITER_GRPC_GATE_MAX"},
		{"grpc gate target too short", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_TARGET": "100us"}, "FLOODGATE_LIMITER_GRPC_GATE_TARGET"},
		{"grpc gate target too long", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_TARGET": "1s"}, "FLOODGATE_LIMITER_GRPC_GATE_TARGET"},
		{"grpc gate target", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_MAX": "64", "FLOODGATE_LIMITER_GRPC_GATE_TARGET": "2ms"}, ""},
		{"grpc reads paced without a gate", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_PACE": "true", "FLOODGATE_LIMITER_GRPC_GATE_MAX": "0", "FLOODGATE_LIMITER_GRPC_TRANSPORT": "floodgate"}, "FLOODGATE_LIMITER_GRPC_GATE_PACE"},
		{"grpc gate off", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_MAX": "0"}, ""},
		{"grpc-go with the default gate", map[string]string{"FLOODGATE_LIMITER_GRPC_TRANSPORT": "grpc-go"}, ""},
		{"grpc reads paced on grpc-go", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_PACE": "true", "FLOODGATE_LIMITER_GRPC_GATE_MAX": "64", "FLOODGATE_LIMITER_GRPC_TRANSPORT": "grpc-go"}, "FLOODGATE_LIMITER_GRPC_GATE_PACE"},
		{"grpc reads paced on the default transport", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_PACE": "true", "FLOODGATE_LIMITER_GRPC_GATE_MAX": "64"}, ""},
		{"grpc reads paced", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_PACE": "true", "FLOODGATE_LIMITER_GRPC_GATE_MAX": "64", "FLOODGATE_LIMITER_GRPC_TRANSPORT": "floodgate"}, ""},
		{"grpc off", map[string]string{"FLOODGATE_LIMITER_GRPC_ADDR": "off"}, ""},
		{"gateway with a control character", map[string]string{"FLOODGATE_GATEWAY": "edge\x01"}, "FLOODGATE_GATEWAY"},
		{"gateway of 65 characters", map[string]string{"FLOODGATE_GATEWAY": strings.Repeat("a", 65)}, "FLOODGATE_GATEWAY"},
		{"gateway of 64 two-byte characters", map[string]string{"FLOODGATE_GATEWAY": strings.Repeat("é", 64)}, ""},
		{"grpc transport unknown", map[string]string{"FLOODGATE_LIMITER_GRPC_TRANSPORT": "grpc"}, "FLOODGATE_LIMITER_GRPC_TRANSPORT"},
		{"grpc transport floodgate", map[string]string{"FLOODGATE_LIMITER_GRPC_TRANSPORT": "floodgate"}, ""},
		{"grpc transport grpc-go", map[string]string{"FLOODGATE_LIMITER_GRPC_TRANSPORT": "grpc-go"}, ""},
		{"debug on the grpc address", map[string]string{"FLOODGATE_LIMITER_DEBUG_ADDR": "127.0.0.1:8081"}, "FLOODGATE_LIMITER_DEBUG_ADDR"},
		{"influx interval", map[string]string{"FLOODGATE_LIMITER_INFLUX_INTERVAL": "1ms"}, "FLOODGATE_LIMITER_INFLUX_INTERVAL"},
		{"beyond loopback without a choice of auth", map[string]string{"FLOODGATE_LIMITER_ADDR": "0.0.0.0:8080"}, "FLOODGATE_LIMITER_AUTH"},
		{"grpc beyond loopback without a choice of auth", map[string]string{"FLOODGATE_LIMITER_GRPC_ADDR": "10.0.0.5:8081"}, "FLOODGATE_LIMITER_AUTH"},
		{"beyond loopback, open on purpose", map[string]string{"FLOODGATE_LIMITER_ADDR": "0.0.0.0:8080", "FLOODGATE_LIMITER_AUTH": "none"}, ""},
		{"tokens without callers", map[string]string{"FLOODGATE_LIMITER_AUTH": "tokens"}, "FLOODGATE_LIMITER_CALLERS"},
		{"callers malformed", map[string]string{"FLOODGATE_LIMITER_AUTH": "tokens", "FLOODGATE_LIMITER_CALLERS": "edge:nothex"}, "FLOODGATE_LIMITER_CALLERS"},
		{"callers with auth none", map[string]string{"FLOODGATE_LIMITER_AUTH": "none", "FLOODGATE_LIMITER_CALLERS": "edge:gateway:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}, "FLOODGATE_LIMITER_CALLERS"},
		{"tokens on any address", map[string]string{"FLOODGATE_LIMITER_ADDR": "0.0.0.0:8080", "FLOODGATE_LIMITER_AUTH": "tokens", "FLOODGATE_LIMITER_CALLERS": "edge:gateway:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}, ""},
		{"callers and their file", map[string]string{"FLOODGATE_LIMITER_AUTH": "tokens", "FLOODGATE_LIMITER_CALLERS": "edge:gateway:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08", "FLOODGATE_LIMITER_CALLERS_FILE": "/nonexistent"}, "FLOODGATE_LIMITER_CALLERS_FILE"},
		{"callers role unknown", map[string]string{"FLOODGATE_LIMITER_AUTH": "tokens", "FLOODGATE_LIMITER_CALLERS": "edge:admin:" + "9f86d081884c7d659a2feaa0c55ad015a3bf4f1b2b0b822cd15d6c15b0f00a08"}, "FLOODGATE_LIMITER_CALLERS"},
		{"auth unknown", map[string]string{"FLOODGATE_LIMITER_AUTH": "maybe"}, "FLOODGATE_LIMITER_AUTH"},
		{"envoy header name", map[string]string{"FLOODGATE_LIMITER_ENVOY_RESET_HEADER": "Reset Time"}, "FLOODGATE_LIMITER_ENVOY_RESET_HEADER"},
		{"grpc tls without its key", map[string]string{"FLOODGATE_LIMITER_GRPC_TLS_CERT_FILE": "/etc/tls/tls.crt"}, "FLOODGATE_LIMITER_GRPC_TLS_KEY_FILE"},
		{"grpc client CA without grpc tls", map[string]string{"FLOODGATE_LIMITER_GRPC_TLS_CLIENT_CA_FILE": "/etc/tls/ca.crt"}, "FLOODGATE_LIMITER_GRPC_TLS_CLIENT_CA_FILE"},
		{"envoy keys unknown", map[string]string{"FLOODGATE_LIMITER_ENVOY_KEYS": "lyft"}, "FLOODGATE_LIMITER_ENVOY_KEYS"},
		{"envoy key prefix with floodgate's keys", map[string]string{"FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX": "rl_"}, "FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX"},
		{"envoy key prefix too long", map[string]string{"FLOODGATE_LIMITER_ENVOY_KEYS": "envoy_ratelimit", "FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX": strings.Repeat("p", 257)}, "FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX"},
		{"envoy ratelimit's keys", map[string]string{"FLOODGATE_LIMITER_ENVOY_KEYS": "envoy_ratelimit", "FLOODGATE_LIMITER_ENVOY_CACHE_KEY_PREFIX": "rl_"}, ""},
		{"envoy local cache", map[string]string{"FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES": "100000"}, ""},
		{"grpc on a unix socket, no auth", map[string]string{"FLOODGATE_LIMITER_GRPC_ADDR": "unix:/run/floodgate/rls.sock"}, ""},
		{"envoy near-limit ratio", map[string]string{"FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO": "0.5"}, ""},
		{"envoy expiration jitter", map[string]string{"FLOODGATE_LIMITER_ENVOY_EXPIRATION_JITTER_MAX_SECONDS": "300"}, ""},
		{"envoy expiration jitter negative", map[string]string{"FLOODGATE_LIMITER_ENVOY_EXPIRATION_JITTER_MAX_SECONDS": "-1"}, "FLOODGATE_LIMITER_ENVOY_EXPIRATION_JITTER_MAX_SECONDS"},
		{"envoy near-limit ratio 0", map[string]string{"FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO": "0"}, "FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO"},
		{"envoy near-limit ratio over 1", map[string]string{"FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO": "1.5"}, "FLOODGATE_LIMITER_ENVOY_NEAR_LIMIT_RATIO"},
		{"envoy local cache negative", map[string]string{"FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES": "-1"}, "FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES"},
		{"envoy local cache too large", map[string]string{"FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES": "1048577"}, "FLOODGATE_LIMITER_ENVOY_LOCAL_CACHE_ENTRIES"},
		{"envoy principal key without a kind", map[string]string{"FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS": "user,customer"}, "FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS"},
		{"envoy principal keys with kinds", map[string]string{"FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS": "customer=user,client_ip", "FLOODGATE_LIMITER_ENVOY_IP_KEY": "client_ip"}, ""},
		{"envoy default keys with another ip key", map[string]string{"FLOODGATE_LIMITER_ENVOY_IP_KEY": "client_ip"}, "FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS"},
		{"envoy events off", map[string]string{"FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS": "none"}, ""},
		{"envoy ip key with a comma", map[string]string{"FLOODGATE_LIMITER_ENVOY_IP_KEY": "a,b"}, "FLOODGATE_LIMITER_ENVOY_IP_KEY"},
		{"envoy method key is the ip key", map[string]string{"FLOODGATE_LIMITER_ENVOY_METHOD_KEY": "remote_address"}, "FLOODGATE_LIMITER_ENVOY_METHOD_KEY"},
		{"envoy method key names the principal", map[string]string{"FLOODGATE_LIMITER_ENVOY_METHOD_KEY": "user"}, "FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS"},
		{"sentinel master without sentinels", map[string]string{"FLOODGATE_REDIS_SENTINEL_MASTER": "mymaster"}, "FLOODGATE_REDIS_SENTINEL_ADDRS"},
		{"sentinels without a master name", map[string]string{"FLOODGATE_REDIS_SENTINEL_ADDRS": "127.0.0.1:26379"}, "FLOODGATE_REDIS_SENTINEL_MASTER"},
		{"identity proxies not CIDRs", map[string]string{"FLOODGATE_LIMITER_PROXY_IDENTITY_TRUSTED": "10.0.0.0/99"}, "FLOODGATE_LIMITER_PROXY_IDENTITY_TRUSTED"},
		{"anonymous IPv6 prefix", map[string]string{"FLOODGATE_LIMITER_PROXY_ADDR": "127.0.0.1:8090", "FLOODGATE_LIMITER_PROXY_UPSTREAM": "http://127.0.0.1:9000", "FLOODGATE_LIMITER_PROXY_ANON_IPV6_PREFIX": "0"}, "FLOODGATE_LIMITER_PROXY_ANON_IPV6_PREFIX"},
		{"one header for kind and id", map[string]string{"FLOODGATE_LIMITER_PROXY_ADDR": "127.0.0.1:8090", "FLOODGATE_LIMITER_PROXY_UPSTREAM": "http://127.0.0.1:9000", "FLOODGATE_LIMITER_PROXY_ID_HEADER": "x-principal-kind"}, "FLOODGATE_LIMITER_PROXY_ID_HEADER"},
		{"proxy", map[string]string{"FLOODGATE_LIMITER_PROXY_ADDR": "127.0.0.1:8090", "FLOODGATE_LIMITER_PROXY_UPSTREAM": "http://127.0.0.1:9000", "FLOODGATE_LIMITER_PROXY_IDENTITY_TRUSTED": "192.168.0.0/16", "FLOODGATE_LIMITER_PROXY_ANON_IPV6_PREFIX": "56"}, ""},
		{"sentinel", map[string]string{"FLOODGATE_REDIS_SENTINEL_MASTER": "mymaster", "FLOODGATE_REDIS_SENTINEL_ADDRS": "127.0.0.1:26379,127.0.0.1:26380"}, ""},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			if tc.want == "" {
				require.NoError(t, err)
				if tc.env["FLOODGATE_LIMITER_ENVOY_PRINCIPAL_KEYS"] == "none" {
					require.Nil(t, c.EnvoyIdentity, "no events, no penalties or scales on envoy domains")
				} else {
					require.NotNil(t, c.EnvoyIdentity, "on by default")
				}
				return
			}
			require.ErrorContains(t, err, tc.want)
		})
	}
}

// TestGRPCGateDefaults: the entry gate is on unless set to 0, 64 calls at
// once per processor, its reads paced on the floodgate transport only —
// grpc-go keeps the gate and starts without pacing, not with an error.
func TestGRPCGateDefaults(t *testing.T) {
	for _, tc := range []struct {
		name string
		env  map[string]string
		max  int
		pace bool
	}{
		{"defaults", nil, 64 * runtime.GOMAXPROCS(0), true},
		{"grpc-go", map[string]string{"FLOODGATE_LIMITER_GRPC_TRANSPORT": "grpc-go"}, 64 * runtime.GOMAXPROCS(0), false},
		{"off", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_MAX": "0"}, 0, false},
		{"reads not paced", map[string]string{"FLOODGATE_LIMITER_GRPC_GATE_PACE": "false"}, 64 * runtime.GOMAXPROCS(0), false},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c, err := ConfigFromEnv(func(k string) string { return tc.env[k] })
			require.NoError(t, err)
			require.Equal(t, tc.max, c.GRPCGateMax)
			require.Equal(t, tc.pace, c.GRPCGatePace)
		})
	}
}
