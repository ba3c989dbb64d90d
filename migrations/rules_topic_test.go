package migrations

import (
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/config"
)

// TestRulesTopicMigration: the rules topic is one compacted partition, so
// every limiter replica reads all versions in one order (docs/rollouts.md).
// The detector parameters topic (docs/detector.md) is made the same way.
func TestRulesTopicMigration(t *testing.T) {
	ms, err := Load()
	require.NoError(t, err)
	for _, name := range []string{config.DefaultRulesTopic, config.DefaultDetectorParamsTopic} {
		var found *TopicSpec
		for _, m := range ms {
			for i, tp := range m.Kafka.Topics {
				if tp.Name == name {
					found = &m.Kafka.Topics[i]
				}
			}
		}
		require.NotNil(t, found, "a migration creates %s", name)
		require.Equal(t, 1, found.Partitions)
		require.Equal(t, "compact", found.Config["cleanup.policy"])
	}
}
