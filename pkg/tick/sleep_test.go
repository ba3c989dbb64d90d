package tick

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
)

func TestSleep(t *testing.T) {
	t.Parallel()
	cancelled, cancel := context.WithCancel(context.Background())
	cancel()
	tests := []struct {
		name string
		ctx  context.Context
		d    time.Duration
		want bool
	}{
		{name: "waits the whole duration", ctx: context.Background(), d: time.Millisecond, want: true},
		{name: "no wait", ctx: context.Background(), d: 0, want: true},
		{name: "done context cuts a long wait", ctx: cancelled, d: time.Hour, want: false},
		{name: "done context, no wait", ctx: cancelled, d: -time.Second, want: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			start := time.Now()
			require.Equal(t, tt.want, Sleep(tt.ctx, tt.d))
			require.Less(t, time.Since(start), time.Minute, "a done context returns at once")
			if tt.want {
				require.GreaterOrEqual(t, time.Since(start), tt.d)
			}
		})
	}
}
