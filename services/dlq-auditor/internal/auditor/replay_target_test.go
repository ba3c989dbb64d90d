package auditor

import (
	"testing"

	"github.com/stretchr/testify/require"
)

// TestSecurityReplayTargetS13 replays finding S13 of issue 22: a dead-letter
// record names its source topic in a header anyone who can write to the DLQ
// topic can set, and replay wrote wherever it said. Now a dead letter goes
// back only to the topic its DLQ serves, or to a configured allowlist.
func TestSecurityReplayTargetS13(t *testing.T) {
	rp := &Replayer{}
	require.Empty(t, rp.replayTarget(Record{SourceTopic: "floodgate.decisions.v1", DLQTopic: "floodgate.decisions.v1.dlq"}))
	why := rp.replayTarget(Record{SourceTopic: "floodgate.adjustments.v1", DLQTopic: "floodgate.decisions.v1.dlq"})
	require.Contains(t, why, "not replayed")
	require.NotEmpty(t, rp.replayTarget(Record{SourceTopic: "", DLQTopic: ".dlq"}))
	rp.ReplayTopics = []string{"floodgate.adjustments.v1"}
	require.Empty(t, rp.replayTarget(Record{SourceTopic: "floodgate.adjustments.v1", DLQTopic: "floodgate.decisions.v1.dlq"}), "allowlisted")
}
