package stream

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"maps"
	"strings"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/sasl"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// The secured broker's users: one per mechanism, each with its own password,
// so a test that passes proves that mechanism's exchange ran.
const (
	plainUser, plainPass   = "plain-user", "plain-Pa55word-never-logged"
	scram256User, scram256 = "scram256-user", "scram256-Pa55word-never-logged"
	scram512User, scram512 = "scram512-user", "scram512-Pa55word-never-logged"
)

// secureBroker starts an in-process kfake cluster on loopback that speaks
// only TLS (client certificates required when mtls) and only SASL, with a
// PLAIN, a SCRAM-SHA-256 and a SCRAM-SHA-512 user.
func secureBroker(t *testing.T, topics map[string]int32, mtls bool) (addr string, ca *tlstest.CA) {
	t.Helper()
	ca = tlstest.NewCA(t, "kafka-test")
	var clientCAs = ca.Pool()
	if !mtls {
		clientCAs = nil
	}
	_, addr = kafkatest.StartCluster(t, topics,
		kfake.TLS(tlstest.ServerConfig(ca.Server("broker"), clientCAs)),
		kfake.EnableSASL(),
		kfake.Superuser("PLAIN", plainUser, plainPass),
		kfake.Superuser("SCRAM-SHA-256", scram256User, scram256),
		kfake.Superuser("SCRAM-SHA-512", scram512User, scram512),
	)
	return addr, ca
}

// readSecurity reads FLOODGATE_KAFKA_* from vars the way services do.
func readSecurity(t *testing.T, vars map[string]string) config.KafkaSecurity {
	t.Helper()
	e := config.NewEnv(func(k string) string { return vars[k] })
	s := config.ReadKafkaSecurity(e)
	require.NoError(t, e.Err())
	return s
}

// TestSecureProduceConsume produces and consumes through the real Producer
// and Consumer (writer transport, consumer-group dialer, franz-go partition
// reader, offsets client, dead-letter producer) against a broker that
// accepts only TLS and SASL, for every mechanism, with and without a client
// certificate. Nothing in the debug logs shows the password.
func TestSecureProduceConsume(t *testing.T) {
	for _, tc := range []struct {
		mechanism, user, pass string
		mtls                  bool
	}{
		{config.SASLPlain, plainUser, plainPass, false},
		{config.SASLScramSHA256, scram256User, scram256, false},
		{config.SASLScramSHA512, scram512User, scram512, true},
	} {
		t.Run(fmt.Sprintf("%s mtls=%v", tc.mechanism, tc.mtls), func(t *testing.T) {
			topic := "secure." + strings.ReplaceAll(tc.mechanism, "-", "")
			addr, ca := secureBroker(t, map[string]int32{topic: 2, topic + ".dlq": 1}, tc.mtls)
			vars := map[string]string{
				"FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile,
				"FLOODGATE_KAFKA_SASL_MECHANISM": tc.mechanism, "FLOODGATE_KAFKA_SASL_USERNAME": tc.user,
				"FLOODGATE_KAFKA_SASL_PASSWORD": tc.pass,
			}
			if tc.mtls {
				client := ca.Client("floodgate-client")
				vars["FLOODGATE_KAFKA_TLS_CERT_FILE"], vars["FLOODGATE_KAFKA_TLS_KEY_FILE"] = client.CertFile, client.KeyFile
			}
			var logs stacktest.Log
			log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
			defer cancel()
			sec, err := Secure(ctx, []string{addr}, readSecurity(t, vars), 10*time.Second, log)
			require.NoError(t, err)
			require.NotNil(t, sec)

			p := NewProducer(ProducerConfig{Brokers: []string{addr}, Security: sec, Topic: topic, Logger: log})
			defer p.Close()
			var sent []kafka.Message
			for i := range 20 {
				sent = append(sent, kafka.Message{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))})
			}
			require.NoError(t, p.Publish(ctx, sent...))

			got := make(chan string, 100)
			cfg := fastConsumerConfig(t, addr, topic, "g-"+topic, prometheus.NewRegistry())
			cfg.Security, cfg.Logger = sec, log
			c, err := NewConsumer(cfg, func(_ context.Context, m kafka.Message) error {
				if string(m.Key) == "k7" {
					// One failure per run, to the dead-letter producer (it shares the security).
					return Permanent(fmt.Errorf("refused on purpose"))
				}
				got <- string(m.Value)
				return nil
			})
			require.NoError(t, err)
			stop := runConsumer(t, c)
			seen := map[string]bool{}
			for len(seen) < 19 {
				select {
				case v := <-got:
					seen[v] = true
				case <-ctx.Done():
					t.Fatalf("consumed %d of 19 messages: %v", len(seen), seen)
				}
			}
			require.Eventually(t, func() bool {
				var sum int64
				for _, o := range committedOffsetsSecure(t, sec, addr, "g-"+topic, topic, 2) {
					sum += o
				}
				return sum == 20
			}, 20*time.Second, 100*time.Millisecond, "the group commits all 20 offsets over the secured connection")
			require.NoError(t, stop())

			dlq := readPartitionSecure(t, sec, addr, topic+".dlq", 0, 1)
			require.Equal(t, "k7", string(dlq[0].Key), "the dead letter went out through the secured producer")

			require.NotEmpty(t, logs.String(), "debug logs were captured")
			require.NotContains(t, logs.String(), tc.pass, "no log line carries the password")
		})
	}
}

func committedOffsetsSecure(t *testing.T, sec *Security, addr, group, topic string, partitions int) []int64 {
	t.Helper()
	parts := make([]int, partitions)
	for i := range parts {
		parts[i] = i
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	resp, err := sec.Client([]string{addr}, 5*time.Second).OffsetFetch(ctx, &kafka.OffsetFetchRequest{GroupID: group, Topics: map[string][]int{topic: parts}})
	require.NoError(t, err)
	out := make([]int64, partitions)
	for _, p := range resp.Topics[topic] {
		out[p.Partition] = max(p.CommittedOffset, 0)
	}
	return out
}

func readPartitionSecure(t *testing.T, sec *Security, addr, topic string, partition, n int) []kafka.Message {
	t.Helper()
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{addr}, Dialer: sec.Dialer(), Topic: topic, Partition: partition, MaxWait: 100 * time.Millisecond})
	defer r.Close()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	var out []kafka.Message
	for len(out) < n {
		m, err := r.FetchMessage(ctx)
		require.NoError(t, err)
		out = append(out, m)
	}
	return out
}

// TestSecureRefusesBadSettings: what the broker refuses stops start-up at
// once with ErrKafkaAccess, an error naming the variable to fix and never
// the password; and a plaintext client against the TLS listener is refused
// too (by the broker, not by hanging).
func TestSecureRefusesBadSettings(t *testing.T) {
	addr, ca := secureBroker(t, map[string]int32{"t": 1}, false)
	other := tlstest.NewCA(t, "some-other-ca")
	const wrong = "Wr0ng-Password-never-logged"
	good := map[string]string{
		"FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_KAFKA_SASL_MECHANISM": config.SASLScramSHA512, "FLOODGATE_KAFKA_SASL_USERNAME": scram512User,
		"FLOODGATE_KAFKA_SASL_PASSWORD": scram512,
	}
	with := func(k, v string) map[string]string {
		m := maps.Clone(good)
		m[k] = v
		return m
	}
	for _, tc := range []struct {
		name  string
		vars  map[string]string
		names string
	}{
		{"wrong scram password", with("FLOODGATE_KAFKA_SASL_PASSWORD", wrong), "FLOODGATE_KAFKA_SASL_PASSWORD"},
		{"unknown user", with("FLOODGATE_KAFKA_SASL_USERNAME", "mallory"), "FLOODGATE_KAFKA_SASL_USERNAME"},
		{"wrong plain password", with("FLOODGATE_KAFKA_SASL_MECHANISM", config.SASLPlain), "FLOODGATE_KAFKA_SASL_PASSWORD"},
		{"wrong CA", with("FLOODGATE_KAFKA_TLS_CA_FILE", other.CertFile), "FLOODGATE_KAFKA_TLS_CA_FILE"},
		{"system roots", with("FLOODGATE_KAFKA_TLS_CA_FILE", ""), "FLOODGATE_KAFKA_TLS_CA_FILE"},
		{"wrong server name", with("FLOODGATE_KAFKA_TLS_SERVER_NAME", "kafka.example.com"), "FLOODGATE_KAFKA_TLS_SERVER_NAME"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			if tc.vars["FLOODGATE_KAFKA_SASL_MECHANISM"] == config.SASLPlain {
				tc.vars["FLOODGATE_KAFKA_SASL_USERNAME"], tc.vars["FLOODGATE_KAFKA_SASL_PASSWORD"] = plainUser, wrong
			}
			var logs stacktest.Log
			log := slog.New(slog.NewJSONHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
			start := time.Now()
			sec, err := Secure(context.Background(), []string{addr}, readSecurity(t, tc.vars), 10*time.Second, log)
			require.Error(t, err)
			require.Nil(t, sec)
			require.ErrorIs(t, err, ErrKafkaAccess)
			require.Contains(t, err.Error(), tc.names)
			require.Less(t, time.Since(start), 9*time.Second, "refused at once, not after the timeout")
			for _, secret := range []string{wrong, scram512, plainPass} {
				require.NotContains(t, err.Error(), secret)
				require.NotContains(t, logs.String(), secret)
			}
		})
	}

	t.Run("plaintext client against the TLS listener", func(t *testing.T) {
		vars := map[string]string{"FLOODGATE_KAFKA_SASL_MECHANISM": config.SASLPlain,
			"FLOODGATE_KAFKA_SASL_USERNAME": plainUser, "FLOODGATE_KAFKA_SASL_PASSWORD": plainPass}
		start := time.Now()
		sec, err := NewSecurity(context.Background(), readSecurity(t, vars))
		require.NoError(t, err)
		err = CheckAccess(context.Background(), []string{addr}, sec, 3*time.Second, slog.New(slog.DiscardHandler))
		// The TLS listener drops the plaintext bytes; a probe finds it speaks
		// TLS, and start-up stops naming FLOODGATE_KAFKA_TLS (issue 37 T6),
		// never hanging past the timeout.
		require.ErrorIs(t, err, ErrKafkaAccess)
		require.ErrorContains(t, err, "speaks TLS on this port, but FLOODGATE_KAFKA_TLS is not true")
		require.Less(t, time.Since(start), 6*time.Second)
		c := sec.Client([]string{addr}, 2*time.Second)
		_, err = c.Metadata(context.Background(), &kafka.MetadataRequest{})
		require.Error(t, err, "a plaintext client gets nothing from a TLS-only broker")
	})
}

// TestSecureMutualTLS: a broker that requires client certificates refuses
// a client without one, or with one from another CA, at start-up, naming
// the certificate variables; with the right one it answers.
func TestSecureMutualTLS(t *testing.T) {
	addr, ca := secureBroker(t, map[string]int32{"m": 1}, true)
	other := tlstest.NewCA(t, "stranger")
	base := map[string]string{
		"FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_KAFKA_SASL_MECHANISM": config.SASLPlain, "FLOODGATE_KAFKA_SASL_USERNAME": plainUser,
		"FLOODGATE_KAFKA_SASL_PASSWORD": plainPass,
	}
	for _, tc := range []struct {
		name   string
		client *tlstest.Pair
		ok     bool
	}{
		{"no client certificate", nil, false},
		{"certificate from another CA", ptr(other.Client("stranger")), false},
		{"certificate from the broker's CA", ptr(ca.Client("floodgate")), true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vars := map[string]string{}
			for k, v := range base {
				vars[k] = v
			}
			if tc.client != nil {
				vars["FLOODGATE_KAFKA_TLS_CERT_FILE"], vars["FLOODGATE_KAFKA_TLS_KEY_FILE"] = tc.client.CertFile, tc.client.KeyFile
			}
			start := time.Now()
			sec, err := Secure(context.Background(), []string{addr}, readSecurity(t, vars), 10*time.Second, slog.New(slog.DiscardHandler))
			if tc.ok {
				require.NoError(t, err)
				require.Equal(t, "mtls+sasl/plain", sec.String())
				return
			}
			require.ErrorIs(t, err, ErrKafkaAccess)
			require.Contains(t, err.Error(), "FLOODGATE_KAFKA_TLS_CERT_FILE")
			require.NotContains(t, err.Error(), plainPass)
			require.Less(t, time.Since(start), 9*time.Second)
		})
	}
}

func ptr[T any](v T) *T { return &v }

// TestSecureConsumerWithWrongPasswordLogsNoSecret runs a consumer whose
// password the broker refuses (as after a rotation) for a while with debug
// logging: it keeps retrying, and no log line holds the password.
func TestSecureConsumerWithWrongPasswordLogsNoSecret(t *testing.T) {
	addr, ca := secureBroker(t, map[string]int32{"w": 1, "w.dlq": 1}, false)
	const wrong = "Rotated-Away-Password-never-logged"
	sec, err := NewSecurity(context.Background(), readSecurity(t, map[string]string{
		"FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_KAFKA_SASL_MECHANISM": config.SASLScramSHA256, "FLOODGATE_KAFKA_SASL_USERNAME": scram256User,
		"FLOODGATE_KAFKA_SASL_PASSWORD": wrong,
	}))
	require.NoError(t, err)
	var logs stacktest.Log
	log := slog.New(slog.NewTextHandler(&logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	cfg := fastConsumerConfig(t, addr, "w", "g-w", prometheus.NewRegistry())
	cfg.Security, cfg.Logger = sec, log
	c, err := NewConsumer(cfg, func(context.Context, kafka.Message) error { return nil })
	require.NoError(t, err)
	stop := runConsumer(t, c)
	p := NewProducer(ProducerConfig{Brokers: []string{addr}, Security: sec, Topic: "w", Logger: log, MaxAttempts: 2})
	ctx, cancel := context.WithTimeout(context.Background(), 3*time.Second)
	perr := p.Publish(ctx, kafka.Message{Value: []byte("x")})
	cancel()
	_ = p.Close()
	require.Error(t, perr, "the broker refuses the producer")
	require.NotContains(t, perr.Error(), wrong)
	require.Eventually(t, func() bool {
		return strings.Contains(logs.String(), "SASL") || strings.Contains(logs.String(), "uthentication")
	},
		10*time.Second, 50*time.Millisecond, "the consumer logs its refusals")
	_ = stop()
	require.NotContains(t, logs.String(), wrong)
}

// TestSecurityAWSMSKIAM builds the aws-msk-iam mechanism for both clients
// from the AWS SDK's default chain (static keys in the environment here) and
// checks what it would send: a SigV4-signed kafka-cluster:Connect for the
// broker's host, carrying the access key id and never the secret key. (No
// local broker speaks AWS_MSK_IAM; MSK itself is the only server.)
func TestSecurityAWSMSKIAM(t *testing.T) {
	const keyID, secretKey = "AKIDEXAMPLEFLOODGATE", "secret/Key+never-sent-never-logged"
	t.Setenv("AWS_ACCESS_KEY_ID", keyID)
	t.Setenv("AWS_SECRET_ACCESS_KEY", secretKey)
	t.Setenv("AWS_SESSION_TOKEN", "")
	t.Setenv("AWS_PROFILE", "")
	t.Setenv("AWS_CONFIG_FILE", "/nonexistent")
	t.Setenv("AWS_SHARED_CREDENTIALS_FILE", "/nonexistent")
	t.Setenv("AWS_REGION", "")
	t.Setenv("AWS_DEFAULT_REGION", "")
	ca := tlstest.NewCA(t, "iam")
	vars := map[string]string{"FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_KAFKA_SASL_MECHANISM": config.SASLAWSMSKIAM}

	_, err := NewSecurity(context.Background(), readSecurity(t, vars))
	require.ErrorContains(t, err, "FLOODGATE_KAFKA_AWS_REGION", "no region anywhere")

	vars["FLOODGATE_KAFKA_AWS_REGION"] = "eu-west-1"
	sec, err := NewSecurity(context.Background(), readSecurity(t, vars))
	require.NoError(t, err)
	require.Equal(t, "tls+sasl/aws-msk-iam", sec.String())
	require.Equal(t, "AWS_MSK_IAM", sec.mech.Name())
	require.Equal(t, "AWS_MSK_IAM", sec.franz.Name())

	ctx := sasl.WithMetadata(context.Background(), &sasl.Metadata{Host: "b-1.floodgate.abc123.c2.kafka.eu-west-1.amazonaws.com", Port: 9098})
	_, first, err := sec.mech.Start(ctx)
	require.NoError(t, err)
	var payload map[string]string
	require.NoError(t, json.Unmarshal(first, &payload))
	require.Equal(t, "kafka-cluster:Connect", payload["action"])
	require.Equal(t, "b-1.floodgate.abc123.c2.kafka.eu-west-1.amazonaws.com", payload["host"])
	require.Contains(t, payload["x-amz-credential"], keyID+"/")
	require.Contains(t, payload["x-amz-credential"], "/eu-west-1/kafka-cluster/")
	require.NotEmpty(t, payload["x-amz-signature"])
	require.NotContains(t, string(first), secretKey)

	_, franzFirst, err := sec.franz.Authenticate(context.Background(), "b-1.floodgate.abc123.c2.kafka.eu-west-1.amazonaws.com:9098")
	require.NoError(t, err)
	require.Contains(t, string(franzFirst), keyID)
	require.Contains(t, string(franzFirst), "kafka-cluster:Connect")
	require.NotContains(t, string(franzFirst), secretKey)
}

// TestSecurityTransportMismatchT6 replays row 6 of issue 37 for Kafka: a
// broker speaking plaintext where TLS is configured, or TLS where plaintext
// is. On c2eb6a5 the service started and served degraded (the check read it
// as unreachable, or was skipped for plaintext); now Secure stops start-up
// with ErrKafkaAccess naming FLOODGATE_KAFKA_TLS.
func TestSecurityTransportMismatchT6(t *testing.T) {
	plain := kafkatest.Start(t, map[string]int32{"t6": 1})
	tlsAddr, _ := secureBroker(t, map[string]int32{"t6": 1}, false)
	for _, tc := range []struct {
		name, addr string
		vars       map[string]string
		says       string
	}{
		{"TLS configured, the broker plaintext", plain, map[string]string{"FLOODGATE_KAFKA_TLS": "true"},
			"speaks plaintext on this port, but FLOODGATE_KAFKA_TLS is true"},
		{"plaintext configured, the broker TLS", tlsAddr, map[string]string{},
			"speaks TLS on this port, but FLOODGATE_KAFKA_TLS is not true"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			start := time.Now()
			sec, err := Secure(context.Background(), []string{tc.addr}, readSecurity(t, tc.vars), 5*time.Second, slog.New(slog.DiscardHandler))
			require.Nil(t, sec)
			require.ErrorIs(t, err, ErrKafkaAccess)
			require.ErrorContains(t, err, tc.says)
			require.Less(t, time.Since(start), 9*time.Second)
		})
	}
	t.Run("plaintext against a plaintext broker, and a broker that is down", func(t *testing.T) {
		_, err := Secure(context.Background(), []string{plain}, readSecurity(t, nil), 5*time.Second, slog.New(slog.DiscardHandler))
		require.NoError(t, err)
		_, err = Secure(context.Background(), []string{"127.0.0.1:1"}, readSecurity(t, nil), 2*time.Second, slog.New(slog.DiscardHandler))
		require.NoError(t, err, "unreachable is not misconfigured: the clients retry")
	})
}
