package envoypeer

import "testing"

// TestEventsDelivered: a run counts as delivered only when every answered
// call left an event in Kafka and none was refused, failed or dropped.
func TestEventsDelivered(t *testing.T) {
	t.Parallel()
	cases := []struct {
		name string
		ev   Events
		want bool
	}{
		{"all sent", Events{Calls: 10, Sent: 10}, true},
		{"more sent than answered (a caller gave up)", Events{Calls: 10, Sent: 11}, true},
		{"one missing", Events{Calls: 10, Sent: 9}, false},
		{"one refused", Events{Calls: 10, Sent: 10, Dropped: 1}, false},
		{"one failed", Events{Calls: 10, Sent: 10, Failed: 1}, false},
		{"one dropped by the journal", Events{Calls: 10, Sent: 10, JournalDropped: 1}, false},
	}
	for _, tc := range cases {
		if got := tc.ev.Delivered(); got != tc.want {
			t.Errorf("%s: Delivered() = %v, want %v", tc.name, got, tc.want)
		}
	}
}
