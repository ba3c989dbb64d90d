package detector

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
)

// page is one alert as its receiver saw it.
type page struct {
	key, summary string
	details      map[string]any
}

// memAlerter is the in-memory double of Alerter: it keeps every page, and
// fails the next down calls as an unreachable PagerDuty would.
type memAlerter struct {
	mu    sync.Mutex
	pages []page
	down  int
}

var _ Alerter = (*memAlerter)(nil)

func (a *memAlerter) Alert(_ context.Context, key, summary string, details map[string]any) error {
	a.mu.Lock()
	defer a.mu.Unlock()
	if a.down > 0 {
		a.down--
		return fmt.Errorf("alert %s: %w", key, errors.New("pager unavailable"))
	}
	a.pages = append(a.pages, page{key: key, summary: summary, details: details})
	return nil
}

// alerterUnderTest is an Alerter with a view of what its receiver got and a
// way to make the receiver fail the next n calls.
type alerterUnderTest struct {
	Alerter
	pages func() []page
	down  func(n int)
}

// TestAlerterContract runs the contract of Alerter against the PagerDuty pager
// (Events API v2 to a local receiver) and the in-memory double.
func TestAlerterContract(t *testing.T) {
	t.Parallel()
	t.Run("pagerduty", func(t *testing.T) {
		alerterContract(t, func(t *testing.T) alerterUnderTest {
			recv := &pdReceiver{}
			p, err := NewPager(PagerConfig{RoutingKey: "rk", Endpoint: recv.serve(t), MinSeverity: "critical", PerMinute: 1, Now: time.Now,
				Logger: slog.New(slog.NewTextHandler(io.Discard, nil)), Registerer: prometheus.NewRegistry()})
			require.NoError(t, err)
			return alerterUnderTest{Alerter: p, pages: recv.pages, down: func(n int) {
				recv.mu.Lock()
				recv.down = n
				recv.mu.Unlock()
			}}
		})
	})
	t.Run("memory", func(t *testing.T) {
		alerterContract(t, func(*testing.T) alerterUnderTest {
			a := &memAlerter{}
			return alerterUnderTest{Alerter: a, pages: func() []page {
				a.mu.Lock()
				defer a.mu.Unlock()
				return append([]page(nil), a.pages...)
			}, down: func(n int) {
				a.mu.Lock()
				a.down = n
				a.mu.Unlock()
			}}
		})
	})
}

// alerterContract is what every Alerter does.
func alerterContract(t *testing.T, open func(t *testing.T) alerterUnderTest) {
	ctx := context.Background()
	t.Run("every alert reaches the receiver with its key, summary and details", func(t *testing.T) {
		a := open(t)
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", map[string]any{"pattern": "rapid_fire"}))
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:distributed_ip", "enforcement held again", map[string]any{"pattern": "distributed_ip"}))
		require.Equal(t, []page{
			{key: "floodgate:blast_radius:rapid_fire", summary: "enforcement held", details: map[string]any{"pattern": "rapid_fire"}},
			{key: "floodgate:blast_radius:distributed_ip", summary: "enforcement held again", details: map[string]any{"pattern": "distributed_ip"}},
		}, a.pages())
	})
	t.Run("an alert the receiver refused is an error, and the next one goes through", func(t *testing.T) {
		a := open(t)
		a.down(1)
		err := a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", nil)
		require.ErrorContains(t, err, "floodgate:blast_radius:rapid_fire")
		require.Empty(t, a.pages())
		require.NoError(t, a.Alert(ctx, "floodgate:blast_radius:rapid_fire", "enforcement held", nil))
		require.Len(t, a.pages(), 1)
	})
}

// pages returns the trigger events the receiver recorded, as pages.
func (r *pdReceiver) pages() []page {
	r.mu.Lock()
	defer r.mu.Unlock()
	var out []page
	for _, e := range r.events {
		payload, _ := e["payload"].(map[string]any)
		details, _ := payload["custom_details"].(map[string]any)
		out = append(out, page{key: fmt.Sprint(e["dedup_key"]), summary: fmt.Sprint(payload["summary"]), details: details})
	}
	return out
}
