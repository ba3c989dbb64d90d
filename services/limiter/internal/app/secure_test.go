package app

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// TestLimiterOnSecuredKafkaAndRedis runs the limiter app configured only by
// FLOODGATE_* variables against a broker that accepts only TLS + SCRAM-SHA-512
// and a Redis that accepts only mutual TLS + an ACL user: limits are
// enforced in that Redis, every decision event reaches that broker through
// the journaled producer, no log line holds a password, and a wrong Redis
// password or Kafka CA stops start-up naming the variable.
func TestLimiterOnSecuredKafkaAndRedis(t *testing.T) {
	stacktest.Needs(t, "starts redis-server")
	const kafkaPass, redisPass = "limiter-kafka-Pa55-never-logged", "limiter-redis-Pa55-never-logged"
	ca := tlstest.NewCA(t, "limiter-e2e")
	_, broker := kafkatest.StartCluster(t, map[string]int32{config.DefaultDecisionsTopic: 3},
		kfake.TLS(tlstest.ServerConfig(ca.Server("broker"), nil)),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", "limiter", kafkaPass))
	rds := redistest.NewSecure(t, redistest.SecureOptions{CA: ca, ClientCerts: true, Users: map[string]string{"limiter": redisPass}})
	client := ca.Client("limiter")
	httpAddr := stacktest.FreeAddr(t)
	env := map[string]string{
		"FLOODGATE_LIMITER_ADDR": httpAddr, "FLOODGATE_LIMITER_GRPC_ADDR": "off", "FLOODGATE_GATEWAY": "secure-test",
		"FLOODGATE_LIMITER_PRINCIPAL_LIMIT": "2", "FLOODGATE_LIMITER_PRINCIPAL_PERIOD": "1m", "FLOODGATE_LIMITER_INFLUX_INTERVAL": "0",
		"FLOODGATE_JOURNAL_DIR":   t.TempDir(),
		"FLOODGATE_KAFKA_BROKERS": broker, "FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_KAFKA_SASL_MECHANISM": "scram-sha-512", "FLOODGATE_KAFKA_SASL_USERNAME": "limiter", "FLOODGATE_KAFKA_SASL_PASSWORD": kafkaPass,
		"FLOODGATE_REDIS_ADDRS": rds.Addr, "FLOODGATE_REDIS_TLS": "true", "FLOODGATE_REDIS_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_REDIS_TLS_CERT_FILE": client.CertFile, "FLOODGATE_REDIS_TLS_KEY_FILE": client.KeyFile,
		"FLOODGATE_REDIS_USERNAME": "limiter", "FLOODGATE_REDIS_PASSWORD": redisPass,
	}
	lim := startLimiter(t, env)
	stacktest.WaitOK(t, "http://"+httpAddr+"/readyz", 15*time.Second, "limiter ready\n%s", lim.Log.String())

	type answer struct {
		Allowed  bool   `json:"allowed"`
		Degraded bool   `json:"degraded"`
		Error    string `json:"error"`
	}
	checkAs := func(id string) answer {
		body := fmt.Sprintf(`{"principal":{"kind":"bot","id":%q},"ip":"203.0.113.7","method":"POST","route":"/x","cost":1}`, id)
		resp, err := http.Post("http://"+httpAddr+"/v1/check", "application/json", strings.NewReader(body))
		require.NoError(t, err)
		defer resp.Body.Close()
		var d answer
		require.NoError(t, json.NewDecoder(resp.Body).Decode(&d))
		return d
	}
	// The first checks may find no TLS connection dialed yet and answer by
	// fail policy when the handshake outlasts the 50 ms budget on a busy
	// machine; wait for answers from Redis before counting.
	require.Eventually(t, func() bool { return !checkAs(fmt.Sprintf("warmup_%d", time.Now().UnixNano())).Degraded },
		10*time.Second, 20*time.Millisecond, "the limiter answers from the secured Redis")
	id := fmt.Sprintf("secure_bot_%d", time.Now().UnixNano())
	var allowed []bool
	for range 3 {
		d := checkAs(id)
		require.False(t, d.Degraded, "an answer from Redis, not a degraded one: %s", d.Error)
		allowed = append(allowed, d.Allowed)
	}
	require.Equal(t, []bool{true, true, false}, allowed, "the limit is enforced in the secured Redis")

	e := config.NewEnv(stacktest.Getenv(env))
	sec, err := stream.NewSecurity(context.Background(), config.ReadKafkaSecurity(e))
	require.NoError(t, err)
	seen := 0
	deadline := time.Now().Add(20 * time.Second)
	for seen < 3 && time.Now().Before(deadline) {
		seen = 0
		for p := range 3 {
			r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Dialer: sec.Dialer(), Topic: config.DefaultDecisionsTopic, Partition: p, MaxWait: 50 * time.Millisecond})
			rctx, rcancel := context.WithTimeout(context.Background(), 500*time.Millisecond)
			for {
				m, err := r.FetchMessage(rctx)
				if err != nil {
					break
				}
				if d, err := events.DecodeDecision(m.Value); err == nil && d.Principal.ID == id {
					seen++
				}
			}
			rcancel()
			_ = r.Close()
		}
	}
	require.Equal(t, 3, seen, "every decision event reached the secured broker")

	require.NoError(t, lim.Stop())
	out := lim.Log.String()
	require.Contains(t, out, "tls+sasl/scram-sha-512")
	require.NotContains(t, out, kafkaPass)
	require.NotContains(t, out, redisPass)

	other := tlstest.NewCA(t, "not-the-brokers")
	for _, tc := range []struct{ key, value, names string }{
		{"FLOODGATE_REDIS_PASSWORD", "Wr0ng-never-logged", "FLOODGATE_REDIS_PASSWORD"},
		{"FLOODGATE_KAFKA_TLS_CA_FILE", other.CertFile, "FLOODGATE_KAFKA_TLS_CA_FILE"},
	} {
		bad := map[string]string{}
		for k, v := range env {
			bad[k] = v
		}
		bad[tc.key] = tc.value
		bad["FLOODGATE_LIMITER_ADDR"] = stacktest.FreeAddr(t)
		start := time.Now()
		failed := startLimiter(t, bad)
		err := failed.Wait(20 * time.Second)
		require.Error(t, err, tc.key)
		require.Contains(t, err.Error(), tc.names)
		require.Less(t, time.Since(start), 10*time.Second)
		for _, s := range []string{"Wr0ng-never-logged", kafkaPass, redisPass} {
			require.NotContains(t, err.Error()+failed.Log.String(), s)
		}
	}
}
