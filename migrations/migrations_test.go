package migrations

import (
	"fmt"
	"strings"
	"testing"
	"testing/fstest"
	"time"

	"github.com/aws/aws-sdk-go-v2/aws"
	"github.com/aws/aws-sdk-go-v2/service/dynamodb"
	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/dynamo"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stacktest"
)

func TestEmbeddedMigrationsLoad(t *testing.T) {
	ms, err := Load()
	require.NoError(t, err)
	require.Equal(t, 1, ms[0].Version)
	names := map[string]int{}
	for _, topic := range ms[0].Kafka.Topics {
		names[topic.Name] = topic.Partitions
	}
	for _, base := range []string{config.DefaultDecisionsTopic, config.DefaultAbuseTopic, config.DefaultAdjustmentsTopic} {
		require.Contains(t, names, base)
		require.Contains(t, names, base+".dlq", "every topic has its dead-letter topic")
	}
	require.GreaterOrEqual(t, names[config.DefaultDecisionsTopic], 6, "decisions are partitioned for parallel consumers")
	require.Equal(t, config.DefaultInfluxBucket, ms[0].InfluxDB.Databases[0].Name+"/"+ms[0].InfluxDB.Databases[0].RetentionPolicy.Name,
		"the default bucket the services write to is the one the migration creates")
}

func TestLoadRejects(t *testing.T) {
	valid := "version: 1\nname: initial\nkafka:\n  topics:\n    - {name: t1, partitions: 1}\n"
	cases := []struct {
		name  string
		files map[string]string
		want  string
	}{
		{"bad file name", map[string]string{"1_x.yaml": valid}, "file name must look like"},
		{"version mismatch", map[string]string{"0002_initial.yaml": valid}, "does not match the file name"},
		{"gap in sequence", map[string]string{"0001_initial.yaml": valid, "0003_more.yaml": "version: 3\nname: more\n"}, "out of sequence"},
		{"unknown field", map[string]string{"0001_initial.yaml": valid + "kafak: {}\n"}, "field kafak not found"},
		{"zero partitions", map[string]string{"0001_initial.yaml": "version: 1\nname: initial\nkafka:\n  topics:\n    - {name: t1, partitions: 0}\n"}, "kafka.topics[0].partitions: 0 not in 1..1000"},
		{"bad retention", map[string]string{"0001_initial.yaml": "version: 1\nname: initial\nkafka:\n  topics:\n    - {name: t1, partitions: 1, config: {retention.ms: soon}}\n"}, "retention.ms"},
		{"bad key type", map[string]string{"0001_initial.yaml": "version: 1\nname: initial\ndynamodb:\n  tables:\n    - {name: tbl, partition_key: {name: pk, type: X}}\n"}, `dynamodb.tables[0].partition_key.type: "X" is not one of S|N|B`},
		{"bad influx duration", map[string]string{"0001_initial.yaml": "version: 1\nname: initial\ninfluxdb:\n  databases:\n    - {name: db, retention_policy: {name: rp, duration: month}}\n"}, "retention_policy.duration"},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			fsys := fstest.MapFS{}
			for name, body := range tc.files {
				fsys[name] = &fstest.MapFile{Data: []byte(body)}
			}
			_, err := load(fsys)
			require.Error(t, err)
			require.Contains(t, err.Error(), tc.want)
		})
	}
}

// TestApplyReconcilesRealBackends runs the real migrations against a fresh
// Kafka-protocol broker, DynamoDB Local (tables under a per-run prefix) and InfluxDB.
func TestApplyReconcilesRealBackends(t *testing.T) {
	ctx := stacktest.Context(t, 2*time.Minute, "needs the local stack; run `make test`")
	stack := stacktest.Local()
	endpoint, influxURL := stack.DynamoEndpoint, stack.InfluxURL

	broker := kafkatest.Start(t, nil)
	ddb, err := dynamo.NewClient(ctx, dynamo.Options{Endpoint: endpoint})
	require.NoError(t, err)
	prefix := fmt.Sprintf("t%d_", time.Now().UnixNano())
	t.Cleanup(func() { stacktest.DropTables(t, ddb, prefix) })

	var lines []string
	r := &Runner{
		Kafka:  NewKafka([]string{broker}, 1, nil),
		Dynamo: &Dynamo{Client: ddb, Prefix: prefix},
		Influx: &Influx{URL: influxURL},
		Now:    time.Now,
		Report: func(l string) { lines = append(lines, l) },
	}
	ms, err := Load()
	require.NoError(t, err)
	require.NoError(t, r.Apply(ctx, ms), "first apply (is the local stack up?)")
	require.Contains(t, strings.Join(lines, "\n"), "floodgate.decisions.v1: created with 12 partitions")
	require.Contains(t, strings.Join(lines, "\n"), "recorded in the ledger")

	// The tables exist with their TTL and index.
	desc, err := ddb.DescribeTable(ctx, &dynamodb.DescribeTableInput{TableName: aws.String(prefix + dynamo.TableAbuseRecords)})
	require.NoError(t, err)
	require.Len(t, desc.Table.GlobalSecondaryIndexes, 1)
	ttl, err := ddb.DescribeTimeToLive(ctx, &dynamodb.DescribeTimeToLiveInput{TableName: aws.String(prefix + dynamo.TableQuotaLedger)})
	require.NoError(t, err)
	require.Equal(t, "expires_at", aws.ToString(ttl.TimeToLiveDescription.AttributeName))

	// Second apply: nothing to do.
	lines = nil
	require.NoError(t, r.Apply(ctx, ms))
	for _, l := range lines {
		require.NotContains(t, l, "created", "second apply must not create anything")
		require.NotContains(t, l, "recorded", "second apply must not rewrite the ledger")
	}

	// Drift is repaired: a retention changed by hand is set back.
	client := &kafka.Client{Addr: kafka.TCP(broker)}
	_, err = client.IncrementalAlterConfigs(ctx, &kafka.IncrementalAlterConfigsRequest{Resources: []kafka.IncrementalAlterConfigsRequestResource{{
		ResourceType: kafka.ResourceTypeTopic, ResourceName: config.DefaultAbuseTopic,
		Configs: []kafka.IncrementalAlterConfigsRequestConfig{{Name: "retention.ms", Value: "1000", ConfigOperation: kafka.ConfigOperationSet}},
	}}})
	require.NoError(t, err)
	lines = nil
	require.NoError(t, r.Apply(ctx, ms))
	require.Contains(t, strings.Join(lines, "\n"), "kafka topic floodgate.abuse.v1: config set [retention.ms]")

	// An applied migration that was edited afterwards stops the run.
	edited := append([]Migration(nil), ms...)
	edited[0].Checksum = "0000" + edited[0].Checksum[4:]
	err = r.Apply(ctx, edited)
	require.ErrorIs(t, err, ErrChecksum)
}

func TestKafkaGrowsPartitions(t *testing.T) {
	ctx := stacktest.Context(t, time.Minute, "needs a broker")
	broker := kafkatest.Start(t, map[string]int32{"grow.me": 2})
	k := NewKafka([]string{broker}, 1, nil)
	var lines []string
	require.NoError(t, k.Apply(ctx, []TopicSpec{{Name: "grow.me", Partitions: 4}}, func(l string) { lines = append(lines, l) }))
	require.Contains(t, strings.Join(lines, "\n"), "partitions 2 -> 4")
	fresh := &kafka.Client{Addr: kafka.TCP(broker), Transport: &kafka.Transport{}} // no cached metadata
	meta, err := fresh.Metadata(ctx, &kafka.MetadataRequest{Topics: []string{"grow.me"}})
	require.NoError(t, err)
	require.Len(t, meta.Topics[0].Partitions, 4)
}
