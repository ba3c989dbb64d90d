package migrations

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// TestRulesTopicMigration: the rules topic is one compacted partition, so
// every limiter replica reads all versions in one order (docs/rollouts.md).
func TestRulesTopicMigration(t *testing.T) {
	ms, err := Load()
	require.NoError(t, err)
	var found *TopicSpec
	for _, m := range ms {
		for i, tp := range m.Kafka.Topics {
			if tp.Name == config.DefaultRulesTopic {
				found = &m.Kafka.Topics[i]
			}
		}
	}
	require.NotNil(t, found, "a migration creates %s", config.DefaultRulesTopic)
	require.Equal(t, 1, found.Partitions)
	require.Equal(t, "compact", found.Config["cleanup.policy"])
}
