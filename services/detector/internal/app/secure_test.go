package app

import (
	"context"
	"fmt"
	"log/slog"
	"net/netip"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/redisx"
	"github.com/floodgate-dev/floodgate/pkg/redisx/redistest"
	"github.com/floodgate-dev/floodgate/pkg/service"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

const (
	kafkaUser, kafkaPass = "detector", "kafka-Pa55-never-logged"
	redisUser, redisPass = "detector", "redis-Pa55-never-logged"
)

// secureStack is a Kafka-protocol broker that speaks only TLS + SASL
// SCRAM-SHA-512 with the migrations' topics, and a redis-server that speaks
// only mutual TLS with an ACL user (the default user off), both on loopback
// and both this test's own; env is what a deployment would set.
func secureStack(t *testing.T) (env map[string]string, sec *stream.Security, redisSec config.RedisSecurity) {
	t.Helper()
	ca := tlstest.NewCA(t, "detector-e2e")
	_, broker := kafkatest.StartCluster(t, nil,
		kfake.TLS(tlstest.ServerConfig(ca.Server("broker"), nil)),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-512", kafkaUser, kafkaPass))
	rds := redistest.NewSecure(t, redistest.SecureOptions{CA: ca, ClientCerts: true, Users: map[string]string{redisUser: redisPass}})
	client := ca.Client("detector")
	env = map[string]string{
		"FLOODGATE_KAFKA_BROKERS": broker,
		"FLOODGATE_KAFKA_TLS":     "true", "FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_KAFKA_SASL_MECHANISM": "scram-sha-512", "FLOODGATE_KAFKA_SASL_USERNAME": kafkaUser,
		"FLOODGATE_KAFKA_SASL_PASSWORD": kafkaPass,
		"FLOODGATE_REDIS_ADDRS":         rds.Addr,
		"FLOODGATE_REDIS_TLS":           "true", "FLOODGATE_REDIS_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_REDIS_TLS_CERT_FILE": client.CertFile, "FLOODGATE_REDIS_TLS_KEY_FILE": client.KeyFile,
		"FLOODGATE_REDIS_USERNAME": redisUser, "FLOODGATE_REDIS_PASSWORD": redisPass,
		"FLOODGATE_DETECTOR_ADDR":         "127.0.0.1:0",
		"FLOODGATE_DETECTOR_GROUP":        "secure-detector",
		"FLOODGATE_PAGER_GROUP":           "secure-pager",
		"FLOODGATE_DETECTOR_RECORDS":      "off",
		"FLOODGATE_PAGERDUTY_ROUTING_KEY": "",
		// Nothing listens there: the recorder's points are dropped, which is
		// all this test needs of InfluxDB.
		"FLOODGATE_INFLUX_URL": "http://127.0.0.1:1",
	}
	e := config.NewEnv(stacktest.Getenv(env))
	ksec, rsec := config.ReadKafkaSecurity(e), config.ReadRedisSecurity(e)
	require.NoError(t, e.Err())
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	sec, err := stream.NewSecurity(ctx, ksec)
	require.NoError(t, err)
	ms, err := migrations.Load()
	require.NoError(t, err)
	for _, m := range ms {
		require.NoError(t, migrations.NewKafka([]string{broker}, 1, sec).Apply(ctx, m.Kafka.Topics, func(string) {}), "migrate topics over TLS + SASL")
	}
	return env, sec, rsec
}

// TestDetectorOnSecuredKafkaAndRedis runs the detector app (Run, what the
// binary runs) configured only through FLOODGATE_* variables against a
// broker that accepts only TLS + SCRAM-SHA-512 and a Redis that accepts
// only mutual TLS + an ACL user: a rapid-fire burst produced over the
// secured broker is consumed, the penalty lands in the secured Redis, the
// abuse event comes out on the secured broker, and no log line holds either
// password.
func TestDetectorOnSecuredKafkaAndRedis(t *testing.T) {
	stacktest.Needs(t, "starts redis-server")
	env, sec, rsec := secureStack(t)
	det := stacktest.Start(t, "detector", func(ctx context.Context, log *slog.Logger) error {
		return Run(ctx, service.NewEnv("detector", service.Stdio{Getenv: stacktest.Getenv(env)}, log))
	})

	bot := events.Principal{Kind: events.PrincipalBot, ID: fmt.Sprintf("secure%d", time.Now().UnixNano())}
	start := time.Now().Add(-20 * time.Second)
	var msgs []kafka.Message
	for i := range 2000 {
		d := &events.Decision{ID: fmt.Sprintf("%s-%d", bot.ID, i), TS: start.Add(time.Duration(i) * 5 * time.Millisecond), Principal: bot,
			IP: netip.MustParseAddr("203.0.113.9"), Method: "POST", Route: "/a", Tier: events.TierPrincipal, Cost: 1, Limit: 50, Gateway: "t"}
		b, err := events.EncodeDecision(d)
		require.NoError(t, err)
		msgs = append(msgs, kafka.Message{Key: []byte(d.Key()), Value: b})
	}
	p := stream.NewProducer(stream.ProducerConfig{Brokers: []string{env["FLOODGATE_KAFKA_BROKERS"]}, Security: sec, Topic: config.DefaultDecisionsTopic})
	defer p.Close()
	pctx, pcancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer pcancel()
	require.NoError(t, p.Publish(pctx, msgs...))

	rdb := redisx.NewClient(redisx.Options{Addrs: []string{env["FLOODGATE_REDIS_ADDRS"]}, DialTimeout: time.Second, Security: rsec})
	defer rdb.Close()
	require.Eventually(t, func() bool {
		if exited, err := det.Exited(); exited {
			t.Fatalf("detector stopped: %v\n%s", err, det.Log.String())
		}
		n, err := rdb.Exists(context.Background(), redisx.PenaltyKey(string(bot.Kind), bot.ID)).Result()
		return err == nil && n == 1
	}, 60*time.Second, 100*time.Millisecond, "the penalty reaches the secured Redis")

	found := false
	for _, part := range []int{0, 1, 2} {
		rr := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{env["FLOODGATE_KAFKA_BROKERS"]}, Dialer: sec.Dialer(),
			Topic: config.DefaultAbuseTopic, Partition: part, MaxWait: 100 * time.Millisecond})
		rctx, rcancel := context.WithTimeout(context.Background(), 3*time.Second)
		for !found {
			m, err := rr.FetchMessage(rctx)
			if err != nil {
				break
			}
			a, err := events.DecodeAbuse(m.Value)
			require.NoError(t, err)
			found = a.Principal == bot
		}
		rcancel()
		_ = rr.Close()
	}
	require.True(t, found, "the abuse event was published over the secured broker")

	out := det.Log.String()
	require.Contains(t, out, "tls+sasl/scram-sha-512", "start-up logs the Kafka security, not its secrets")
	require.NotContains(t, out, kafkaPass)
	require.NotContains(t, out, redisPass)
}

// TestDetectorRefusesWrongCredentials: a wrong password for either store
// stops the detector at start-up (no retry loop), with an error naming the
// variable and holding no password.
func TestDetectorRefusesWrongCredentials(t *testing.T) {
	stacktest.Needs(t, "starts redis-server")
	env, _, _ := secureStack(t)
	other := tlstest.NewCA(t, "not-the-brokers")
	const wrong = "Wr0ng-never-logged"
	for _, tc := range []struct{ name, key, value, names string }{
		{"redis password", "FLOODGATE_REDIS_PASSWORD", wrong, "FLOODGATE_REDIS_PASSWORD"},
		{"kafka password", "FLOODGATE_KAFKA_SASL_PASSWORD", wrong, "FLOODGATE_KAFKA_SASL_PASSWORD"},
		{"kafka CA", "FLOODGATE_KAFKA_TLS_CA_FILE", other.CertFile, "FLOODGATE_KAFKA_TLS_CA_FILE"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			bad := map[string]string{}
			for k, v := range env {
				bad[k] = v
			}
			bad[tc.key] = tc.value
			var logs stacktest.Log
			ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
			defer cancel()
			start := time.Now()
			err := Run(ctx, service.NewEnv("detector", service.Stdio{Getenv: stacktest.Getenv(bad)}, logs.Logger(slog.LevelDebug)))
			require.Error(t, err)
			require.Less(t, time.Since(start), 10*time.Second, "refused at start-up, not after retrying")
			require.Contains(t, err.Error(), tc.names)
			for _, s := range []string{wrong, kafkaPass, redisPass} {
				require.NotContains(t, err.Error(), s)
				require.NotContains(t, logs.String(), s)
			}
		})
	}
}
