package main

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/floodgate-dev/floodgate/migrations"
	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
	"github.com/floodgate-dev/floodgate/pkg/tlstest"
)

// TestMigrateOverTLSAndSCRAM runs the migrate command against a broker that
// accepts only TLS + SCRAM-SHA-256, configured by FLOODGATE_KAFKA_* alone:
// every topic of migrations/ is created; a wrong password stops it at once
// with an error naming the variable and not holding the password.
func TestMigrateOverTLSAndSCRAM(t *testing.T) {
	ca := tlstest.NewCA(t, "migrate")
	const user, pass = "migrate", "migrate-Pa55-never-logged"
	_, broker := kafkatest.StartCluster(t, nil, kfake.TLS(tlstest.ServerConfig(ca.Server("broker"), nil)),
		kfake.EnableSASL(), kfake.Superuser("SCRAM-SHA-256", user, pass))
	env := map[string]string{
		"FLOODGATE_KAFKA_BROKERS": broker, "FLOODGATE_KAFKA_TLS": "true", "FLOODGATE_KAFKA_TLS_CA_FILE": ca.CertFile,
		"FLOODGATE_KAFKA_SASL_MECHANISM": "scram-sha-256", "FLOODGATE_KAFKA_SASL_USERNAME": user, "FLOODGATE_KAFKA_SASL_PASSWORD": pass,
		"FLOODGATE_KAFKA_ACLS": "true", "FLOODGATE_KAFKA_ACL_USER_PREFIX": "prod-",
	}
	getenv := func(k string) string { return env[k] }
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	require.NoError(t, run(ctx, []string{"-only", "kafka", "-timeout", "30s"}, getenv))

	e := config.NewEnv(getenv)
	sec, err := stream.NewSecurity(ctx, config.ReadKafkaSecurity(e))
	require.NoError(t, err)
	ms, err := migrations.Load()
	require.NoError(t, err)
	var want []string
	for _, m := range ms {
		for _, tp := range m.Kafka.Topics {
			want = append(want, tp.Name)
		}
	}
	meta, err := sec.Client([]string{broker}, 5*time.Second).Metadata(ctx, &kafka.MetadataRequest{})
	require.NoError(t, err)
	var got []string
	for _, tp := range meta.Topics {
		got = append(got, tp.Name)
	}
	require.Subset(t, got, want, "every topic of migrations/ exists on the secured broker")
	acls, err := sec.Client([]string{broker}, 5*time.Second).DescribeACLs(ctx, &kafka.DescribeACLsRequest{Filter: kafka.ACLFilter{
		ResourceTypeFilter: kafka.ResourceTypeTopic, ResourceNameFilter: config.DefaultDecisionsTopic, ResourcePatternTypeFilter: kafka.PatternTypeLiteral,
		Operation: kafka.ACLOperationTypeWrite, PermissionType: kafka.ACLPermissionTypeAllow}})
	require.NoError(t, err)
	require.NoError(t, acls.Error)
	var writers []string
	for _, r := range acls.Resources {
		for _, a := range r.ACLs {
			writers = append(writers, a.Principal)
		}
	}
	require.ElementsMatch(t, []string{"User:prod-limiter", "User:prod-dlq-auditor"}, writers, "FLOODGATE_KAFKA_ACLS: only these write decisions")

	env["FLOODGATE_KAFKA_SASL_PASSWORD"] = "Wr0ng-never-logged"
	start := time.Now()
	err = run(ctx, []string{"-only", "kafka", "-timeout", "30s"}, getenv)
	require.ErrorIs(t, err, stream.ErrKafkaAccess)
	require.ErrorContains(t, err, "FLOODGATE_KAFKA_SASL_PASSWORD")
	require.NotContains(t, err.Error(), "Wr0ng-never-logged")
	require.Less(t, time.Since(start), 10*time.Second)
}
