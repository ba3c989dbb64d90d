package cli

import (
	"context"
	"testing"
)

func TestMainRunsWithALiveContext(t *testing.T) {
	ran := false
	Main(nil, "test", func(ctx context.Context) error {
		ran = ctx.Err() == nil
		return nil
	})
	if !ran {
		t.Fatal("run was not called with a live context")
	}
}
