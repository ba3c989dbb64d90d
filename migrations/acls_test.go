package migrations

import (
	"context"
	"testing"
	"time"

	"github.com/segmentio/kafka-go"
	"github.com/stretchr/testify/require"
	"github.com/twmb/franz-go/pkg/kfake"

	"github.com/floodgate-dev/floodgate/pkg/config"
	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
	"github.com/floodgate-dev/floodgate/pkg/stream"
)

// TestSecurityOnlyTheLimiterWritesDecisionsS3 replays S3 — a decision event
// with cost 1,000,000, produced by something other than the limiter, quota-
// locked a victim — against a broker that checks ACLs: with the grants of
// Grants applied, every service but the limiter (and the dlq-auditor's
// replay) is refused on the decisions topic, while each can still do its own
// work.
func TestSecurityOnlyTheLimiterWritesDecisionsS3(t *testing.T) {
	const mech = "SCRAM-SHA-512"
	pass := func(svc string) string { return svc + "-Pa55" }
	n := ACLNames{}.withDefaults()
	opts := []kfake.Opt{kfake.EnableSASL(), kfake.EnableACLs(), kfake.Superuser(mech, "admin", "admin-Pa55")}
	for _, g := range Grants(n) {
		opts = append(opts, kfake.User(mech, n.UserPrefix+g.Service, pass(g.Service)))
	}
	topics := map[string]int32{n.DecisionsTopic: 1, n.AbuseTopic: 1, n.DecisionsTopic + ".dlq": 1, n.DeferredTopic: 1}
	_, broker := kafkatest.StartCluster(t, topics, opts...)
	ctx, cancel := context.WithTimeout(context.Background(), time.Minute)
	defer cancel()
	secure := func(user, pw string) *stream.Security {
		s, err := stream.NewSecurity(ctx, config.KafkaSecurity{SASLMechanism: config.SASLScramSHA512, SASLUsername: user, SASLPassword: config.Secret(pw)})
		require.NoError(t, err)
		return s
	}
	as := func(svc string) *stream.Security { return secure(n.UserPrefix+svc, pass(svc)) }
	produce := func(svc, topic string) error {
		w := &kafka.Writer{Addr: kafka.TCP(broker), Topic: topic, Transport: as(svc).Transport(), RequiredAcks: kafka.RequireAll, MaxAttempts: 1}
		defer w.Close()
		return w.WriteMessages(ctx, kafka.Message{Key: []byte("user:victim"), Value: []byte(`{"cost":1000000}`)})
	}

	require.Error(t, produce("detector", n.DecisionsTopic), "before the grants only superusers pass")
	var lines []string
	k := NewKafka([]string{broker}, 1, secure("admin", "admin-Pa55"))
	require.NoError(t, k.ApplyACLs(ctx, ACLEntries(n, Grants(n)), func(l string) { lines = append(lines, l) }))
	require.Equal(t, []string{"kafka acls: 104 entries for 7 users"}, lines)
	require.NoError(t, k.ApplyACLs(ctx, ACLEntries(n, Grants(n)), func(string) {}), "applying again is a no-op")

	require.NoError(t, produce("limiter", n.DecisionsTopic))
	for _, svc := range []string{"detector", "quota", "console"} { // they read it: they see it, and are refused
		require.ErrorContains(t, produce(svc, n.DecisionsTopic), "TOPIC_AUTHORIZATION_FAILED", "%s must not write decision events", svc)
	}
	require.ErrorContains(t, produce("adjuster", n.DecisionsTopic), "Unknown Topic", "the adjuster does not even see it")
	require.NoError(t, produce("dlq-auditor", n.DecisionsTopic), "the audited replay of a dead letter")
	require.NoError(t, produce("detector", n.AbuseTopic))
	require.NoError(t, produce("quota", n.DecisionsTopic+".dlq"))
	require.NoError(t, produce("limiter", n.DeferredTopic), "the edge defers requests")
	require.ErrorContains(t, produce("deferred", n.DecisionsTopic), "Unknown Topic", "the deferred-work worker replays through the limiter, never into decisions")
	require.ErrorContains(t, produce("limiter", n.AbuseTopic), "Unknown Topic", "the limiter writes decisions only")

	// The quota ledger still reads decisions in its own group, and only there.
	read := func(svc, topic, group string) error {
		r := kafka.NewReader(kafka.ReaderConfig{Brokers: []string{broker}, Topic: topic, GroupID: group,
			Dialer: as(svc).Dialer(), StartOffset: kafka.FirstOffset, MaxWait: 100 * time.Millisecond})
		defer r.Close()
		rctx, cancel := context.WithTimeout(ctx, 10*time.Second)
		defer cancel()
		_, err := r.FetchMessage(rctx)
		return err
	}
	require.NoError(t, read("quota", n.DecisionsTopic, n.QuotaGroup))
	require.Error(t, read("quota", n.DecisionsTopic, n.DetectorGroup), "another service's group is refused")
	// The dlq-auditor reads each dead-letter topic in that topic's own group.
	dlq := n.DecisionsTopic + stream.DLQSuffix
	require.NoError(t, read("dlq-auditor", dlq, stream.AuditGroup(n.DLQGroup, dlq)))
	require.Error(t, read("dlq-auditor", dlq, n.DLQGroup), "the bare prefix is no group of the auditor's")
}
