package server

import (
	"context"
	"log/slog"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"

	"github.com/floodgate-dev/floodgate/pkg/kafkatest"
)

// Emit publishes every event, through either publisher interface, except
// in the benchmark build without events (-tags floodgate_noevents), where
// it publishes none:
//
//	go test -tags floodgate_noevents -run TestEmitPublishesUnlessBuiltWithoutEvents ./pkg/limiter/server/
func TestEmitPublishesUnlessBuiltWithoutEvents(t *testing.T) {
	t.Parallel()
	want := 0
	if Publishing {
		want = 3
	}
	log := slog.New(slog.DiscardHandler)
	plain, app := &kafkatest.Capture{}, &copyAppender{}
	sp := New(Config{Publisher: plain, Topic: "decisions", Gateway: "emit-test", Logger: log, Registry: prometheus.NewRegistry()})
	sa := New(Config{Publisher: app, Topic: "decisions", Gateway: "emit-test", Logger: log, Registry: prometheus.NewRegistry()})
	for i := range 3 {
		ev := emitEvent(i)
		sp.Emit(context.Background(), &ev)
		sa.Emit(context.Background(), &ev)
	}
	require.Len(t, plain.Messages(), want, "through TryPublish")
	require.Len(t, app.appended, want, "through TryAppend")
}
