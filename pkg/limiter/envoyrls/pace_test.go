package envoyrls

import (
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/testutil"
	"github.com/stretchr/testify/require"
	"google.golang.org/grpc/metadata"

	"github.com/floodgate-dev/floodgate/pkg/events"
	"github.com/floodgate-dev/floodgate/pkg/limiter/admission"
)

// TestPacerGivesTurnsNewestFirst: a connection reads at once while the
// gate's queue holds less than half a round; past it, connections wait,
// and each call that leaves the queue gives a turn to the connection that
// began waiting last, counted until that connection has handled its read;
// one that waits its longest reads anyway.
func TestPacerGivesTurnsNewestFirst(t *testing.T) {
	cfg := GateConfig(8, 0, nil) // a limit of 8, fixed
	cfg.Queue = admission.QueueConfig{Target: time.Second, Interval: time.Second, MaxWait: 10 * time.Second, MaxLen: 100}
	reg := prometheus.NewRegistry()
	g := newGate(cfg, reg)
	const maxWait = 2 * time.Second
	p := newPacer(g, maxWait, reg)

	require.True(t, p.Turn(nil), "a turn at once counts until Done")
	require.Equal(t, 1.0, testutil.ToFloat64(p.atOnce), "nothing queued: a turn at once")
	p.Done()

	var permits []time.Time
	for range 8 {
		start, err := g.enter(nil, time.Time{}, false)
		require.NoError(t, err)
		permits = append(permits, start)
	}
	hold := make(chan struct{})
	defer close(hold)
	for i := range 4 { // half a round queued: no room
		go func() {
			if start, err := g.enter(nil, time.Now().Add(time.Minute), false); err == nil {
				<-hold
				g.exit(start)
			}
		}()
		require.Eventually(t, func() bool { return g.lim.Waiting() == int64(i+1) }, time.Second, time.Millisecond)
	}

	turned := make([]chan time.Time, 3)
	began := time.Now()
	for i := range turned {
		turned[i] = make(chan time.Time, 1)
		go func() {
			p.Turn(nil)
			turned[i] <- time.Now()
		}()
		require.Eventually(t, func() bool { return p.n.Load() == int64(i+1) }, time.Second, time.Millisecond)
	}
	for i := range turned {
		require.Empty(t, turned[i], "connection %d read without a turn", i)
	}

	g.exit(permits[0]) // a queued call goes through: room for one
	select {
	case <-turned[2]:
	case <-time.After(time.Second):
		t.Fatal("the newest connection was given no turn")
	}
	require.Equal(t, 1.0, testutil.ToFloat64(p.given))
	require.Equal(t, int64(2), p.n.Load(), "the two older connections still wait")
	require.Empty(t, turned[0])
	require.Empty(t, turned[1])

	// The newest connection's turn counts until it has handled its read:
	// only then is there room for another, and a turn handed back gives
	// none by itself.
	require.Equal(t, int64(1), p.granted.Load())
	newcomer := make(chan struct{})
	go func() {
		p.Turn(nil)
		close(newcomer)
	}()
	require.Eventually(t, func() bool { return p.n.Load() == 3 }, time.Second, time.Millisecond, "no room: the newcomer waits")
	p.Done()
	require.Empty(t, turned[1], "a turn handed back gives none by itself")
	p.kick() // as the next call leaving the queue does
	select {
	case <-newcomer:
	case <-time.After(time.Second):
		t.Fatal("the newest connection was given no turn")
	}
	for i := range 2 {
		select {
		case at := <-turned[i]:
			require.GreaterOrEqual(t, at.Sub(began), maxWait, "connection %d read before its longest wait", i)
		case <-time.After(3 * maxWait):
			t.Fatalf("connection %d still waits past its longest wait", i)
		}
	}
	require.Equal(t, 2.0, testutil.ToFloat64(p.turns.WithLabelValues("max_wait")))
	require.Equal(t, 2.0, testutil.ToFloat64(p.given))
	require.Zero(t, p.n.Load())

	require.True(t, p.Unpaced(metadata.Pairs(MetadataPriority, string(events.PriorityCritical))), "a CRITICAL cluster's connection is not paced")
	require.False(t, p.Unpaced(metadata.Pairs(MetadataPriority, "degraded")))
}

// TestPacerGivesTurnsWhileTheGateIsIdle: the room is taken by turns under
// way (until Done) and by calls on their way to a worker (until Started),
// so reads cannot run ahead of the workers. While the gate has a call, a
// turn handed back or a call started gives no turn (the call's exit will);
// with the gate idle no call will leave it, so either gives the turns the
// room now has, and a connection does not wait its longest after a burst.
func TestPacerGivesTurnsWhileTheGateIsIdle(t *testing.T) {
	for _, tc := range []struct {
		name          string
		take, release func(p *pacer)
	}{
		{"a turn handed back", func(p *pacer) { require.True(t, p.Turn(nil)) }, (*pacer).Done},
		{"a call started", (*pacer).Dispatched, (*pacer).Started},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := newGate(GateConfig(8, 0, nil), nil) // room: half a round, 4
			p := newPacer(g, time.Hour, nil)
			for range 4 {
				tc.take(p)
			}
			turned := make(chan struct{})
			go func() {
				p.Turn(nil)
				close(turned)
			}()
			require.Eventually(t, func() bool { return p.n.Load() == 1 }, time.Second, time.Millisecond, "the room taken: the next waits")
			start, err := g.enter(nil, time.Time{}, false)
			require.NoError(t, err)
			tc.release(p)
			select {
			case <-turned:
				t.Fatalf("%s gave a turn while a call was under way", tc.name)
			case <-time.After(50 * time.Millisecond):
			}
			g.lim.Release(start) // idle again, without exit's own kick
			tc.release(p)
			select {
			case <-turned:
			case <-time.After(time.Second):
				t.Fatalf("%s with the gate idle gave no turn", tc.name)
			}
		})
	}
}
