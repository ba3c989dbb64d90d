package main

import (
	"strconv"
	"testing"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// TestGroupMemberKilledInJoinIsExpired replays the chaos scenario
// consumer-kill's hang against the broker program: kfake alone never
// expires a member killed while its JoinGroup waited in a rebalance; the
// program's session keeper must (see kafkatest.ExpectKilledJoinerExpired).
func TestGroupMemberKilledInJoinIsExpired(t *testing.T) {
	port := freePort(t)
	startBroker(t, []string{"-port", strconv.Itoa(port), "-log-level", "warn"})
	kafkatest.ExpectKilledJoinerExpired(t, "127.0.0.1:"+strconv.Itoa(port))
}
